"""EliminateEmits: remove Emits the facts prove to be no-ops (N -> 0, DESIGN §5).

Rules, each named in the report with the facts that justify it:
  * identity views: reshape/squeeze/expand_dims/flatten/broadcast_to to the same
    shape, identity permute_dims, astype to the same dtype, dropout (inference);
  * ``x + 0``, ``x - 0``, ``x * 1``, ``x / 1`` with a constant that does not
    broadcast x to a new shape;
  * inverse permute_dims pairs cancel; a cast pair A -> B -> A only when B represents
    every value of A exactly (float16 -> float32 -> float16 goes, float32 -> float16
    -> float32 stays: it rounds);
  * a reshape/squeeze/expand_dims/flatten of a proven-contiguous tensor becomes a
    plain view (an op call the backend lowers to no kernel) instead of a copy Emit;
  * dead Emits whose every port effect is pure (never one that may write).
A rule whose fact is missing leaves the Emit, and the report says which fact.
Runs before FuseEmits in the pipeline's fixpoint; re-propagate afterwards.
"""

from __future__ import annotations

from typing import Any, Optional

import tvm
from tvm import relax

from aicf_tvm.elimination import (
    compose_permutations, is_constant_fill, is_free_view, is_identity_permutation, represents_exactly,
)
from aicf_tvm.emit_graph import EmitGraph, Node
from aicf_tvm.kinds.describe import type_shape
from aicf_tvm.lattice import Failure, ShapeFact
from aicf_tvm.report import Decision, FusionReport

from .group_rewrite import drop_unused_emits, with_blocks
from .propagate_contracts import FactTable, analyze

_VIEWS = {"reshape", "squeeze", "expand_dims", "flatten", "batch_flatten"}
_NEUTRAL = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "divide": 1.0}


def _shape(table: FactTable, expr: Any) -> ShapeFact:
    fact = table.of(expr) if isinstance(getattr(expr, "ty", None), relax.TensorType) else None
    return ShapeFact.top() if fact is None or isinstance(fact, tuple) else fact.facts.shape


def _same_type(a: Any, b: Any) -> bool:
    return isinstance(a.ty, relax.TensorType) and isinstance(b.ty, relax.TensorType) and \
        str(a.ty.dtype) == str(b.ty.dtype) and type_shape(a.ty) == type_shape(b.ty) and \
        type_shape(a.ty).is_static()


class _Rules:
    def __init__(self, graph: EmitGraph, table: FactTable) -> None:
        self.graph, self.table = graph, table

    def producer(self, expr: Any) -> Optional[Node]:
        return self.graph.node_of(expr) if isinstance(expr, relax.Var) else None

    def decide(self, node: Node) -> tuple[Optional[Any], str, list[Failure]]:
        """(replacement or None, rule/justification, failures of a rule that almost applied)."""
        kind, body, var = node.emit.kind, node.body, node.var
        if body is None:
            return None, "", []
        x = node.value.args[0] if node.value.args else None
        if kind in _VIEWS | {"broadcast_to", "permute_dims", "astype"} and x is not None and _same_type(x, var):
            if kind != "permute_dims" or is_identity_permutation(_axes(body), var.ty.ndim):
                return x, f"identity {kind}: input and output are {type_shape(var.ty).show()}", []
        if kind == "permute_dims":
            src = self.producer(x)
            if src is not None and src.emit is not None and src.emit.kind == "permute_dims" and src.body is not None:
                first, second = _axes(src.body), _axes(body)
                if first and second and is_identity_permutation(compose_permutations(first, second), len(first)):
                    return src.value.args[0], "inverse permute_dims pair cancels", []
        if kind == "astype":
            src = self.producer(x)
            if src is not None and src.emit is not None and src.emit.kind == "astype":
                a, b = str(src.value.args[0].ty.dtype), str(x.ty.dtype)
                if str(var.ty.dtype) == a and _same_type(src.value.args[0], var):
                    if represents_exactly(a, b):
                        return src.value.args[0], f"cast pair {a}->{b}->{a}: {b} represents {a} exactly", []
                    return None, "", [Failure(f"{src.var.name}->{var.name}.exact", f"{a}->{b}", f"{b} ⊇ {a}")]
        if kind in _NEUTRAL and len(node.value.args) == 2:
            a, c = node.value.args
            if kind in ("add", "multiply") and is_constant_fill(a, _NEUTRAL[kind]):
                a, c = c, a
            if is_constant_fill(c, _NEUTRAL[kind]) and _same_type(a, var):
                return a, f"x {kind} {_NEUTRAL[kind]:g}: the constant is neutral and broadcasts nothing", []
        if kind in _VIEWS and x is not None:
            src = _shape(self.table, x)
            if is_free_view(src, type_shape(var.ty).dims):
                return "view", f"{kind} of {src.show()}: a view of the same storage", []
            want = ShapeFact.contiguous(src.dims) if src.dims is not None else ShapeFact.top()
            return None, "", [Failure(f"{var.name}.x.shape", src, want)]
        return None, "", []


def _axes(call: Any) -> Optional[list[int]]:
    axes = getattr(call.attrs, "axes", None)
    if axes is None:
        nd = call.args[0].ty.ndim
        return list(range(nd))[::-1]
    return [int(a) for a in axes]


def _is_pure(node: Node) -> bool:
    inputs = {p.name for p in node.emit.interface.inputs}
    provides = node.emit.contract.provides
    return all(not provides.port(p).effect.writes for p in inputs)


def eliminate_block(graph: EmitGraph, table: FactTable, report: FusionReport) -> Optional[relax.DataflowBlock]:
    rules = _Rules(graph, table)
    bindings, changed = [], False
    for node in graph.nodes:
        b = graph.block.bindings[node.index]
        if node.emit is None:
            bindings.append(b)
            continue
        if not node.consumers and not node.escapes:
            if _is_pure(node):
                report.add(Decision("eliminate:dead", (node.var.name,), True, note="unused and effect-free"))
                changed = True
                continue
            report.add(Decision("eliminate:dead", (node.var.name,), False, note="unused but may write an input"))
        replacement, why, failures = rules.decide(node)
        if replacement is None:
            if failures:
                report.add(Decision(f"eliminate:{node.emit.kind}", (node.var.name,), False, tuple(failures)))
            bindings.append(b)
            continue
        changed = True
        report.add(Decision(f"eliminate:{node.emit.kind}", (node.var.name,), True, note=why))
        if replacement == "view":
            replacement = relax.Call(node.body.op, [node.value.args[0], *node.body.args[1:]], node.body.attrs,
                                     node.body.ty_args)
        bindings.append(relax.VarBinding(b.var, replacement))
    return relax.DataflowBlock(bindings) if changed else None


@tvm.transform.module_pass(opt_level=0, name="EliminateEmits")
class EliminateEmits:
    """Apply the elimination rules to ``main``; decisions go to ``self.report``."""

    def __init__(self, report: FusionReport | None = None, func_name: str = "main") -> None:
        self.report = report if report is not None else FusionReport()
        self.func_name = func_name

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        if self.func_name not in [gv.name_hint for gv in mod.get_global_vars()]:
            return mod
        for _ in range(8):  # a removal can leave its producer dead: sweep again
            new = self._sweep(mod)
            if new is mod:
                break
            mod = new
        return mod

    def _sweep(self, mod: tvm.IRModule) -> tvm.IRModule:
        table = analyze(mod, self.func_name)
        func = mod[self.func_name]
        blocks, changed, cache = [], False, {}
        for block in func.body.blocks:
            new = None
            if isinstance(block, relax.DataflowBlock):
                new = eliminate_block(EmitGraph(mod, block, cache), table, self.report)
            changed |= new is not None
            blocks.append(new or block)
        if not changed:
            return mod
        bb = relax.BlockBuilder(mod)
        with_blocks(bb, mod, self.func_name, blocks)
        out = relax.transform.CanonicalizeBindings()(bb.get())
        return drop_unused_emits(out)
