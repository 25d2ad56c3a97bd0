"""EmitGraph: a read-only DAG view over one dataflow block of a lifted function.

The IRModule stays the single source of truth; this view only indexes it for the
analyses of fusion: producers and consumers of each binding, which values escape the
block, and convexity of a candidate set (no path leaves the set and re-enters it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import tvm
from tvm import relax

from .emit import Emit, emit_of
from .kinds.registry import OPAQUE, rule_for


@dataclass
class Node:
    """One binding of the block."""

    index: int
    var: relax.Var
    value: relax.Expr
    emit: Emit | None = None  # set when the binding calls an Emit function
    callee: relax.GlobalVar | None = None
    body: relax.Call | None = None  # the single op call inside a single-op Emit function
    producers: list[int] = field(default_factory=list)
    consumers: list[int] = field(default_factory=list)
    escapes: bool = False  # used after the block (a block output)

    @property
    def category(self) -> str:
        if self.emit is None:
            return "structural"
        if self.emit.kind.startswith("fused_"):
            return "fused"
        return rule_for(self.emit.op).category if self.emit.op else OPAQUE

    @property
    def is_opaque(self) -> bool:
        return self.emit is not None and self.category == OPAQUE


def tir_vars_arg(call: relax.Call) -> relax.ShapeExpr | None:
    """The last argument of an Emit call when it is an ``R.shape([...])``: the caller's
    symbolic vars that a fused Emit's ``tir_vars`` parameter takes
    (``relax_passes.group_rewrite.build_group_function``); no tensor, no port, no fact."""
    args = call.args
    return args[-1] if len(args) and isinstance(args[-1], relax.ShapeExpr) else None


def port_args(call: relax.Call) -> list[relax.Expr]:
    """The arguments of an Emit call that are its ports, in port order: all but its
    ``tir_vars_arg``."""
    args = list(call.args)
    return args[:-1] if tir_vars_arg(call) is not None else args


def single_op_body(func: relax.Function) -> relax.Call | None:
    bindings = [b for blk in func.body.blocks for b in blk.bindings]
    if len(bindings) == 1 and isinstance(bindings[0].value, relax.Call):
        return bindings[0].value
    return None


class EmitGraph:
    """Nodes of one dataflow block in program (topological) order."""

    def __init__(self, mod: tvm.IRModule, block: relax.DataflowBlock, emit_cache: dict | None = None) -> None:
        self.mod = mod
        self.block = block
        self.nodes: list[Node] = []
        self.by_var: dict[relax.Var, int] = {}
        cache = {} if emit_cache is None else emit_cache
        for i, b in enumerate(block.bindings):
            node = Node(i, b.var, b.value)
            v = b.value
            if isinstance(v, relax.Call) and isinstance(v.op, relax.GlobalVar):
                if v.op not in cache:
                    func = mod[v.op]
                    emit = emit_of(func) if isinstance(func, relax.Function) else None
                    cache[v.op] = (emit, single_op_body(func) if emit is not None else None)
                node.emit, node.body = cache[v.op]
                node.callee = v.op if node.emit is not None else None
            for used in relax.analysis.free_vars(v):
                j = self.by_var.get(used)
                if j is not None and j not in node.producers:
                    node.producers.append(j)
                    self.nodes[j].consumers.append(i)
            node.escapes = not isinstance(b.var, relax.DataflowVar)
            self.by_var[b.var] = i
            self.nodes.append(node)

    def __len__(self) -> int:
        return len(self.nodes)

    def node_of(self, var: relax.Expr) -> Node | None:
        i = self.by_var.get(var)
        return None if i is None else self.nodes[i]

    def outputs_of(self, members: Iterable[int]) -> list[int]:
        """Members whose value is needed outside the set (by a consumer or the block)."""
        s = set(members)
        return sorted(i for i in s if self.nodes[i].escapes or any(c not in s for c in self.nodes[i].consumers))

    def is_convex(self, members: Iterable[int]) -> bool:
        """No path from the set through a non-member back into the set."""
        s = set(members)
        hi = max(s)
        frontier = [c for i in s for c in self.nodes[i].consumers if c not in s and c < hi]
        seen: set[int] = set()
        while frontier:
            j = frontier.pop()
            if j in seen:
                continue
            seen.add(j)
            for c in self.nodes[j].consumers:
                if c in s:
                    return False
                if c < hi and c not in seen:
                    frontier.append(c)
        return True
