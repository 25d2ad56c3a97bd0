"""FuseAdamSteps: all ``adam_step`` Emits of a block -> one in-place ``fused_adam_step`` kernel.

Horizontal (multi-tensor) fusion: the per-parameter updates are independent, so one
PrimFunc can run them all, and it writes P, M and V into their own buffers
(``call_tir_inplace``): no copy of any of them is allocated. Legal only when

* every written port (P, M, V of every step) is NoAlias with every other port of the
  group (docs/design.md §3 Alias): the same value or the same caller input is MustAlias, two
  different caller inputs are Unknown unless the function asserts
  ``aicf.distinct_inputs`` (then refined to NoAlias, ``Alias.refine``), a view shares
  storage (MayAlias), fresh buffers are NoAlias; an Emit's ``asserted`` facts refine too;
* nothing after the fused call reads an old P, M or V (the value, its caller input or
  the tuple holding it), since the kernel overwrites them;
* the group can sit at its last member: nothing before it uses a step's results.

Otherwise it refuses; the report names the pair and both lattice values
(``alias(x.grad, x.m): Unknown ⋢ NoAlias required by fused_adam_step``) or the reader.

Runs after the fusion fixpoint, right before LowerEmits: it fuses and lowers at once,
because an in-place kernel has no pure Relax form for LegalizeOps/FuseTIR to build
(and those leave ``call_tir_inplace`` alone). Refused steps stay Emits and lower to
ordinary, out-of-place kernels. Sound: the kernel computes each step's formula
elementwise, M and V before P as the Emit does; with no aliasing and no later reader of
the old values, overwriting them is unobservable.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from aicf_tvm.core.emit import EMIT_ATTR
from aicf_tvm.core.emit_graph import EmitGraph
from aicf_tvm.core.facts import FactTable, alias_between
from aicf_tvm.core.kinds.adam import (
    ADAM_PORTS,
    DISTINCT_INPUTS_ATTR,
    OUT_OF,
    WRITTEN,
    fused_adam_kernel,
    fused_emit,
)
from aicf_tvm.core.lattice import MUST_ALIAS, NO_ALIAS, UNKNOWN_ALIAS, Alias, Failure
from aicf_tvm.core.report import Decision, FusionReport
from aicf_tvm.core.tvm_values import static_shape

from .emit_rewrite import EmitRewrite
from .lift_adam_steps import caller_paths

KIND = "fused_adam_step"


class AliasFacts:
    """Alias of two values of one function, from the propagated facts and the caller's assertion."""

    def __init__(self, func: relax.Function, table: FactTable) -> None:
        self.table, self.paths = table, caller_paths(func)
        self.distinct = func.attrs is not None and DISTINCT_INPUTS_ATTR in func.attrs

    def of(self, a: relax.Expr, b: relax.Expr) -> Alias:
        if a.same_as(b):
            return MUST_ALIAS
        pa, pb = self.paths.get(a), self.paths.get(b)
        if pa is not None and pb is not None:
            if pa == pb:
                return MUST_ALIAS
            if self.distinct:
                return UNKNOWN_ALIAS.refine(NO_ALIAS, "caller inputs", f"{DISTINCT_INPUTS_ATTR} of the function")
            return UNKNOWN_ALIAS
        fa, fb = self.table.tensor(a), self.table.tensor(b)
        if fa is None or fb is None:
            return UNKNOWN_ALIAS
        return alias_between(a, b, fa, fb)


def _bytes(ty: relax.TensorType) -> int:
    shape = static_shape(ty) or ()
    return int(np.prod(shape, dtype=np.int64)) * tvm.runtime.DataType(str(ty.dtype)).bits // 8


def _name(expr: relax.Expr) -> str:
    return getattr(expr, "name", None) or type(expr).__name__


class _Group:
    """The adam_step nodes of one block and what rewriting them needs."""

    def __init__(self, graph: EmitGraph, steps: list[int]) -> None:
        self.graph, self.steps = graph, steps
        self.last = max(steps)
        self.reads = {i: [n.index for n in (graph.nodes[c] for c in graph.nodes[i].consumers)] for i in steps}
        self.unit = set(steps) | {c for i in steps for c in self.reads[i]}
        self.proven: dict = {}  # the alias facts checked, set once accepted

    def ports(self) -> list[tuple[str, relax.Expr]]:
        """(label, arg) of every port of every step, labelled ``<param>.<port>``."""
        out = []
        for i in self.steps:
            args = list(self.graph.nodes[i].value.args)
            for port, arg in zip(ADAM_PORTS, args):
                out.append((f"{_name(args[0])}.{port}", arg))
        return out

    def alias_failures(self, facts: AliasFacts) -> list[Failure]:
        ports = self.ports()
        out = []
        for i, (la, a) in enumerate(ports):
            for lb, b in ports[i + 1:]:
                if la.rsplit(".", 1)[1] not in WRITTEN and lb.rsplit(".", 1)[1] not in WRITTEN:
                    continue  # two readers may share a buffer
                fact = facts.of(a, b)
                for k in self._asserted(la, lb, a, b):
                    fact = fact.refine(k, "propagated facts", "an asserted Emit fact")
                if not fact.leq(NO_ALIAS):
                    out.append(Failure(f"alias({la}, {lb})", fact, NO_ALIAS))
        return out

    def _asserted(self, la: str, lb: str, a: relax.Expr, b: relax.Expr) -> list[Alias]:
        for i in self.steps:
            node = self.graph.nodes[i]
            args = list(node.value.args)
            if any(x.same_as(a) for x in args) and any(x.same_as(b) for x in args):
                pa, pb = la.rsplit(".", 1)[1], lb.rsplit(".", 1)[1]
                fact = node.emit.asserted.alias_of(pa, pb)
                return [] if fact.is_top() else [fact]
        return []

    def structural_note(self, facts: AliasFacts, later: list[tuple[int, relax.Var]]) -> str:
        nodes = self.graph.nodes
        for i in self.steps:
            if any(not isinstance(nodes[c].value, relax.TupleGetItem) for c in self.reads[i]) or nodes[i].escapes:
                return f"{nodes[i].var.name}: a step's result tuple is used whole"
            ty = nodes[i].value.args[0].ty
            if static_shape(ty) is None or str(ty.dtype) != str(nodes[self.steps[0]].value.args[0].ty.dtype):
                return f"{nodes[i].var.name}: shapes must be static and dtypes equal"
        for node in nodes[: self.last]:
            if node.index not in self.unit and any(p in self.unit for p in node.producers):
                return f"not convex: {node.var.name} uses an update before the last step"
        written = [a for i in self.steps for p, a in zip(ADAM_PORTS, nodes[i].value.args) if p in WRITTEN]
        for a in written:
            if not isinstance(a, relax.Var):
                return f"{_name(a)}: a written port must be a variable (got a constant)"
        for pos, used in later:
            for a in written:
                if used.same_as(a) or self._contains(facts, used, a):
                    where = nodes[pos].var.name if pos < len(nodes) else "the function's result"
                    return f"{where} reads the old {_name(a)} after {KIND} overwrote it"
        return ""

    @staticmethod
    def _contains(facts: AliasFacts, used: relax.Expr, a: relax.Expr) -> bool:
        pu, pa = facts.paths.get(used), facts.paths.get(a)
        if pu is not None and pa is not None:
            return pa[: len(pu)] == pu
        try:
            fu, fa = facts.table.of(used), facts.table.tensor(a)
        except KeyError:  # a value the analysis did not see: assume it may hold a
            return True
        return fa is not None and any(f.roots & fa.roots for f in fu.tensors())

    def rewrite(self, bb: relax.BlockBuilder, gpu: bool = False) -> relax.DataflowBlock:
        nodes = self.graph.nodes
        steps = [nodes[i] for i in self.steps]
        args = [a for n in steps for a in n.value.args]
        tys = [n.value.args[0].ty for n in steps for _ in range(3)]
        inplace = [6 * k + ADAM_PORTS.index(p) for k in range(len(steps)) for p in OUT_OF]
        shapes = [static_shape(n.value.args[0].ty) for n in steps]
        emits = [n.emit for n in steps]
        kernel = fused_adam_kernel(shapes, str(tys[0].dtype), dict(emits[0].attrs), gpu=gpu)
        emit = fused_emit(emits, self.proven)
        kernel = kernel.with_attr(EMIT_ATTR, emit.to_attr()).with_attr("aicf.kind", KIND)
        gv = bb.add_func(kernel, KIND)
        call = relax.call_tir_inplace(gv, relax.Tuple(args), inplace, tys)
        out_var = relax.DataflowVar(KIND, relax.TupleType(tys))
        bindings = []
        for node in nodes:
            if node.index == self.last:
                bindings.append(relax.VarBinding(out_var, call))
                for k, n in enumerate(steps):
                    for c in self.reads[n.index]:
                        get = nodes[c]
                        bindings.append(relax.VarBinding(get.var, relax.TupleGetItem(out_var, 3 * k + get.value.index)))
            elif node.index not in self.unit:
                bindings.append(self.graph.block.bindings[node.index])
        return relax.DataflowBlock(bindings)


def _later_uses(graph: EmitGraph, group: _Group, rest: relax.Expr) -> list[tuple[int, relax.Var]]:
    out = [(n.index, v) for n in graph.nodes[group.last + 1:] if n.index not in group.unit
           for v in relax.analysis.free_vars(n.value)]
    return out + [(len(graph.nodes), v) for v in relax.analysis.free_vars(rest)]


def plan_block(graph: EmitGraph, facts: AliasFacts, rest: relax.Expr) -> tuple[Decision, _Group | None]:
    """The verdict on fusing the block's adam_step Emits, and the group when accepted."""
    steps = [n.index for n in graph.nodes if n.emit is not None and n.emit.kind == "adam_step"]
    group = _Group(graph, steps)
    names = tuple(_name(graph.nodes[i].value.args[0]) for i in steps)
    attrs = {graph.nodes[i].emit.attrs_key for i in steps}  # lr 0.0 and -0.0 differ
    note = "steps differ in lr, betas, eps or weight decay" if len(attrs) > 1 else ""
    note = note or group.structural_note(facts, _later_uses(graph, group, rest))
    fails = group.alias_failures(facts) if not note else []
    if fails or note:
        return Decision(KIND, names, False, tuple(fails), note), None
    ports = group.ports()
    group.proven = {(la, lb): NO_ALIAS for i, (la, _) in enumerate(ports) for lb, _ in ports[i + 1:]
                    if la.rsplit(".", 1)[1] in WRITTEN or lb.rsplit(".", 1)[1] in WRITTEN}
    copies = sum(3 * _bytes(graph.nodes[i].value.args[0].ty) for i in steps)  # new P, M, V not allocated
    return Decision(KIND, names, True, benefit=copies), group


@tvm.transform.module_pass(opt_level=0, name="FuseAdamSteps")
class FuseAdamSteps(EmitRewrite):
    """Fuse the adam_step Emits of ``main`` into one in-place kernel; verdicts go to ``self.report``."""

    def __init__(self, report: FusionReport | None = None, func_name: str = "main", gpu: bool = False) -> None:
        super().__init__(report, func_name)
        self.gpu = gpu  # the kernel's loops bound to GPU blocks and threads

    def rewrite_block(self, bb: relax.BlockBuilder, graph: EmitGraph,
                      facts: FactTable) -> relax.DataflowBlock | None:
        if not any(n.emit is not None and n.emit.kind == "adam_step" for n in graph.nodes):
            return None
        decision, group = plan_block(graph, AliasFacts(self.func, facts), self.rest())
        self.report.add(decision)
        return None if group is None else group.rewrite(bb, self.gpu)
