"""EliminateEmits: remove Emits the facts prove to be no-ops (N -> 0, docs/design.md §5).

Rules, each named in the report with the facts that justify it:
  * identity views: reshape/squeeze/expand_dims/flatten/broadcast_to to the same
    shape, identity permute_dims, astype to the same dtype, dropout (inference), a concat
    of one tensor (what a key/value cache's ``cat`` of an empty past leaves in an export);
  * ``x + (-0.0)``, ``x - 0.0``, ``x * 1``, ``x / 1`` (and the commuted add/multiply)
    with a constant that does not broadcast x to a new shape; the float constant must
    match bit for bit (``x + 0.0`` stays: it turns -0.0 into +0.0; see
    ``aicf_tvm.core.elimination.RIGHT_NEUTRAL``);
  * inverse permute_dims pairs cancel, and so do inverse ``layout_transform`` pairs between
    NCHW and a blocked ``NCHW{b}c`` (both are bijections: the block divides the
    channels); a cast pair A -> B -> A only when B represents
    every value of A exactly (float16 -> float32 -> float16 goes, float32 -> float16
    -> float32 stays: it rounds);
  * a reshape/squeeze/expand_dims/flatten of a proven-contiguous tensor becomes a
    plain view (an op call the backend lowers to no kernel) instead of a copy Emit;
  * a chain of such views that ends in the shape it started from is its start (they
    keep the row-major order of the elements, so the values are the start's); also
    across single-use elementwise Emits whose other operands are one-element
    constants (``reshape(relu(reshape(x, s)), shape(x))`` is ``relu(x)``, the Emit
    rebuilt at x's shape), which is what ``SinkReshapes`` leaves of a cancelling pair;
  * dead Emits whose every port effect is pure (never one that may write).
A rule whose fact is missing leaves the Emit, and the report says which fact.
Runs before FuseEmits in the pipeline's fixpoint; re-propagate afterwards.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax

from aicf_tvm.core.elimination import (
    compose_permutations,
    is_free_view,
    is_identity_permutation,
    is_neutral_operand,
    represents_exactly,
)
from aicf_tvm.core.emit_graph import EmitGraph, Node
from aicf_tvm.core.facts import FactTable
from aicf_tvm.core.kinds.describe import type_shape
from aicf_tvm.core.kinds.layouts import transform_layouts
from aicf_tvm.core.kinds.registry import BROADCAST, ELEMENTWISE
from aicf_tvm.core.lattice import Failure, ShapeFact
from aicf_tvm.core.report import Decision, FusionReport

from .emit_rewrite import EmitRewrite
from .group_rewrite import body_at_call_site, drop_unused_emits
from .lift_emits import build_emit_function

_VIEWS = {"reshape", "squeeze", "expand_dims", "flatten", "batch_flatten"}
_VIEW_OPS = {"relax.reshape", "relax.squeeze", "relax.expand_dims", "relax.flatten"}

# what replaces an eliminated node: an expression, "view", or the bindings that replace
# the node's (the last binds its var)
Replacement = relax.Expr | str | list[relax.VarBinding]


def _shape(table: FactTable, expr: relax.Expr) -> ShapeFact:
    if not isinstance(getattr(expr, "ty", None), relax.TensorType):
        return ShapeFact.top()
    return table.port_facts(expr).shape


def _same_shape(a: relax.Expr, b: relax.Expr) -> bool:
    """Whether two tensors have the same shape for every binding of the symbolic dims: the
    same extents, static or the same expressions of the same vars (structural equality
    does not identify distinct free vars, so two dims that are only named alike differ)."""
    sa, sb = getattr(a.ty, "shape", None), getattr(b.ty, "shape", None)
    return isinstance(sa, relax.ShapeExpr) and isinstance(sb, relax.ShapeExpr) and tvm_ffi.structural_equal(sa, sb)


def _same_type(a: relax.Expr, b: relax.Expr) -> bool:
    return isinstance(a.ty, relax.TensorType) and isinstance(b.ty, relax.TensorType) and \
        str(a.ty.dtype) == str(b.ty.dtype) and _same_shape(a, b)


def is_view_call(node: Node) -> bool:
    """A plain reshape-like op call (what an earlier sweep made of a view Emit)."""
    v = node.value
    return node.emit is None and isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name in _VIEW_OPS


class _Rules:
    def __init__(self, graph: EmitGraph, table: FactTable, bb: relax.BlockBuilder) -> None:
        self.graph, self.table, self.bb = graph, table, bb

    def producer(self, expr: relax.Expr) -> Node | None:
        return self.graph.node_of(expr) if isinstance(expr, relax.Var) else None

    def decide(self, node: Node) -> tuple[Replacement | None, str, list[Failure]]:
        """(replacement or None, rule/justification, failures of a rule that almost applied).
        A replacement is an expression, ``"view"``, or the list of bindings that replace
        the node's (the last binds its var)."""
        if is_view_call(node):
            return self.view_chain(node) or (None, "", [])
        kind, body, var = node.emit.kind, node.body, node.var
        if body is None:
            return None, "", []
        x = node.value.args[0] if node.value.args else None
        if kind in _VIEWS | {"broadcast_to", "permute_dims", "astype"} and x is not None and _same_type(x, var):
            if kind != "permute_dims" or is_identity_permutation(_axes(body), var.ty.ndim):
                return x, f"identity {kind}: input and output are {type_shape(var.ty).show()}", []
        if kind == "concat" and len(node.value.args) == 1 and _same_type(x, var):
            return x, f"concat of one tensor: its output is {type_shape(var.ty).show()}, the input", []
        if kind == "permute_dims":
            src = self.producer(x)
            if src is not None and src.emit is not None and src.emit.kind == "permute_dims" and src.body is not None:
                first, second = _axes(src.body), _axes(body)
                if first and second and is_identity_permutation(compose_permutations(first, second), len(first)):
                    return src.value.args[0], "inverse permute_dims pair cancels", []
        if kind == "layout_transform":
            src = self.producer(x)
            moved = src is not None and src.emit is not None and src.emit.kind == "layout_transform"
            if moved and src.body is not None:
                first, second = transform_layouts(src.body), transform_layouts(body)
                start = src.value.args[0]
                if first and second and first == second[::-1] and _same_type(start, var):
                    shown = " -> ".join(v or "NCHW" for v in (*first, second[1]))
                    return start, f"inverse layout_transform pair {shown} cancels", []
        if kind == "astype":
            src = self.producer(x)
            if src is not None and src.emit is not None and src.emit.kind == "astype":
                a, b = str(src.value.args[0].ty.dtype), str(x.ty.dtype)
                if str(var.ty.dtype) == a and _same_type(src.value.args[0], var):
                    if represents_exactly(a, b):
                        return src.value.args[0], f"cast pair {a}->{b}->{a}: {b} represents {a} exactly", []
                    return None, "", [Failure(f"{src.var.name}->{var.name}.exact", f"{a}->{b}", f"{b} ⊇ {a}")]
        if len(node.value.args) == 2:
            a, c = node.value.args
            if is_neutral_operand(kind, a, right=False):
                a, c = c, a
            if is_neutral_operand(kind, c, right=True) and _same_type(a, var):
                return a, f"x {kind} {_constant_text(c)}: the constant is neutral and broadcasts nothing", []
        if kind in _VIEWS and x is not None:
            found = self.view_chain(node)
            if found is not None:
                return found
            src = _shape(self.table, x)
            if is_free_view(src, type_shape(var.ty).dims):
                return "view", f"{kind} of {src.show()}: a view of the same storage", []
            want = ShapeFact.contiguous(src.dims) if src.dims is not None else ShapeFact.top()
            return None, "", [Failure(f"{var.name}.x.shape", src, want)]
        return None, "", []

    def _view_input(self, expr: relax.Expr) -> relax.Expr | None:
        """The input of the view (Emit or plain op) that produces ``expr``, else None."""
        n = self.producer(expr)
        if n is None or not (is_view_call(n) or (n.emit is not None and n.emit.kind in _VIEWS and n.body is not None)):
            return None
        return n.value.args[0]

    def _starts_at(self, expr: relax.Expr, var: relax.Var) -> relax.Expr | None:
        """The value up the chain of views ending in ``expr`` that has ``var``'s shape."""
        src = self._view_input(expr)
        while src is not None:
            if _same_shape(src, var):
                return src
            src = self._view_input(src)
        return None

    def _commuting_operand(self, n: Node) -> int | None:
        """Index of ``n``'s one tensor operand when ``n`` is a single-use, pure elementwise
        Emit of that operand and one-element constants that broadcast nothing (so it
        commutes with a reshape of the operand), else None."""
        if n.emit is None or n.body is None or n.category not in (ELEMENTWISE, BROADCAST) or not _is_pure(n) \
                or len(n.consumers) != 1 or n.escapes or not isinstance(n.var.ty, relax.TensorType):
            return None
        operands = [i for i, a in enumerate(n.value.args) if not isinstance(a, tvm.ir.Constant)]
        if len(operands) != 1 or not _same_shape(n.value.args[operands[0]], n.var):
            return None
        rank = n.var.ty.ndim
        for a in n.value.args:
            if isinstance(a, tvm.ir.Constant) and (a.value.numpy().size != 1 or a.ty.ndim > rank):
                return None
        return operands[0]

    def view_chain(self, node: Node) -> tuple[Replacement, str, list[Failure]] | None:
        """A view chain, possibly through commuting elementwise Emits, that returns to the
        shape it started from: its start (rebuilt through those Emits)."""
        x, var = node.value.args[0], node.var
        start = self._starts_at(x, var) if isinstance(var.ty, relax.TensorType) else None
        if start is not None and str(start.ty.dtype) == str(var.ty.dtype):
            return start, f"view chain back to {type_shape(var.ty).show()} cancels", []
        chain, operand = [], x
        while (n := self.producer(operand)) is not None and (k := self._commuting_operand(n)) is not None:
            chain.insert(0, (n, k))
            operand = n.value.args[k]
            start = self._starts_at(operand, var)
            if start is not None and all(a.ty.ndim <= start.ty.ndim for m, _ in chain for a in m.value.args
                                         if isinstance(a, tvm.ir.Constant)):
                rebuilt = self._rebuilt(chain, start, var)
                names = ", ".join(m.emit.kind for m, _ in chain)
                why = f"view chain back to {type_shape(var.ty).show()} cancels across {names}"
                return (rebuilt, why, []) if rebuilt is not None else None
        return None

    def _rebuilt(self, chain: list[tuple[Node, int]], start: relax.Expr,
                 var: relax.Var) -> list[relax.VarBinding] | None:
        """The chain's Emits applied to ``start`` instead, each lifted at its new shape."""
        out, value = [], start
        for j, (n, k) in enumerate(chain):
            body = body_at_call_site(self.graph.mod, n)
            args = [value if a.same_as(n.value.args[k]) else a for a in body.args]
            call = self.bb.normalize(relax.Call(body.op, args, body.attrs, body.ty_args))
            built = build_emit_function(call)
            if built is None:
                return None
            gv = self.bb.add_func(built[0], n.callee.name_hint)
            new = var if j == len(chain) - 1 else relax.DataflowVar(f"{n.var.name}_{j}", call.ty)
            out.append(relax.VarBinding(new, self.bb.normalize(relax.Call(gv, list(built[1])))))
            value = new
        return out


def _constant_text(c: tvm.ir.Constant) -> str:
    flat = c.value.numpy().reshape(-1)
    return repr(flat[0].item()) if flat.size == 1 else f"{flat[0].item()!r} (all {flat.size})"


def _axes(call: relax.Call) -> list[int] | None:
    axes = getattr(call.attrs, "axes", None)
    if axes is None:
        nd = call.args[0].ty.ndim
        return list(range(nd))[::-1]
    return [int(a) for a in axes]


def _is_pure(node: Node) -> bool:
    inputs = {p.name for p in node.emit.interface.inputs}
    provides = node.emit.contract.provides
    return all(not provides.port(p).effect.writes for p in inputs)


def eliminate_block(bb: relax.BlockBuilder, graph: EmitGraph, table: FactTable,
                    report: FusionReport) -> relax.DataflowBlock | None:
    rules = _Rules(graph, table, bb)
    bindings, changed = [], False
    for node in graph.nodes:
        b = graph.block.bindings[node.index]
        if node.emit is None and not is_view_call(node):
            bindings.append(b)
            continue
        kind = node.emit.kind if node.emit is not None else node.value.op.name.removeprefix("relax.")
        if not node.consumers and not node.escapes:
            if node.emit is None or _is_pure(node):
                report.add(Decision("eliminate:dead", (node.var.name,), True, note="unused and effect-free"))
                changed = True
                continue
            report.add(Decision("eliminate:dead", (node.var.name,), False, note="unused but may write an input"))
        replacement, why, failures = rules.decide(node)
        if replacement is None:
            if failures:
                report.add(Decision(f"eliminate:{kind}", (node.var.name,), False, tuple(failures)))
            bindings.append(b)
            continue
        changed = True
        report.add(Decision(f"eliminate:{kind}", (node.var.name,), True, note=why))
        if isinstance(replacement, list):
            bindings.extend(replacement)
            continue
        if isinstance(replacement, str) and replacement == "view":
            replacement = body_at_call_site(graph.mod, node)
        bindings.append(relax.VarBinding(b.var, replacement))
    return relax.DataflowBlock(bindings) if changed else None


@tvm.transform.module_pass(opt_level=0, name="EliminateEmits")
class EliminateEmits(EmitRewrite):
    """Apply the elimination rules to ``main``; decisions go to ``self.report``."""

    sweeps = 8  # a removal can leave its producer dead: sweep again

    def rewrite_block(self, bb: relax.BlockBuilder, graph: EmitGraph,
                      facts: FactTable) -> relax.DataflowBlock | None:
        return eliminate_block(bb, graph, facts, self.report)

    def finish(self, mod: tvm.IRModule) -> tvm.IRModule:
        return drop_unused_emits(relax.transform.CanonicalizeBindings()(mod))
