"""BoundShapes: simplify symbolic shapes with the bounds the frontend states.

``torch.export`` states a bound for every dynamic dimension (``Dim("seq", max=512)``) and
TVM's PyTorch frontend records it as the function attrs ``tir_var_lower_bound`` /
``tir_var_upper_bound``. Shape inference does not use them: slicing a 512-row position
table to the first ``seq`` rows infers ``min(seq, 512)`` rows, and adding that to a
``seq``-row tensor cannot be proven to broadcast, so the sum loses its shape (rank only)
and nothing after it can be lowered. This pass simplifies every tensor shape of a
function under those bounds (``min(seq, 512)`` is ``seq`` when ``seq <= 512``), and marks a
``strided_slice`` ``assume_inbound`` where the bounds prove ``0 <= begin <= end <= dim`` on
every sliced axis, so inference gives it exactly ``end - begin`` rows; the shapes of the
bindings after it are re-inferred and become exact.

Sound: the bound is the frontend's own precondition on the inputs (torch.export guards
it, the compiled model checks it at every call before anything runs), and under it the
simplified expressions are equal to the originals for every binding of the dims; a slice
proven in bounds is the same slice with or without its clamp. Runs on op-level Relax,
first when a frontend normalizes its import and again in ``normalize``; functions without
bounds are left unchanged.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, sym, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator


def bounds_of(func: relax.Function) -> dict[str, tuple[int | None, int | None]]:
    """``{var name: (lower, upper)}`` from the function's ``tir_var_*_bound`` attrs."""
    attrs = func.attrs or {}
    out: dict[str, tuple[int | None, int | None]] = {}
    for key, slot in (("tir_var_lower_bound", 0), ("tir_var_upper_bound", 1)):
        for name, value in dict(attrs.get(key, {}) if key in attrs else {}).items():
            pair = list(out.get(str(name), (None, None)))
            pair[slot] = int(value)
            out[str(name)] = (pair[0], pair[1])
    return out


def bound_analyzer(func: relax.Function) -> sym.Analyzer | None:
    """An analyzer that knows each bounded symbolic dim's range, or None without bounds."""
    bounds = bounds_of(func)
    if not bounds:
        return None
    analyzer = sym.Analyzer()
    for var in relax.analysis.defined_symbolic_vars(func):
        lo, hi = bounds.get(var.name, (None, None))
        if hi is not None:
            lo = 0 if lo is None else lo
            analyzer.bind(var, tvm.ir.Range.from_min_extent(lo, hi - lo + 1))
        elif lo is not None:
            analyzer.update(var, sym.ConstIntBound(lo, sym.ConstIntBound.POS_INF))
    return analyzer


def _simplify_type(ty: relax.Type, analyzer: sym.Analyzer) -> relax.TensorType | None:
    """``ty`` with every shape dim simplified, or None when nothing changes."""
    if not isinstance(ty, relax.TensorType) or ty.shape is None or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    dims = list(ty.shape.values)
    new = [analyzer.simplify(d) if not isinstance(d, tirx.IntImm) else d for d in dims]
    if all(tvm_ffi.structural_equal(a, b) for a, b in zip(dims, new)):
        return None
    return relax.TensorType(relax.ShapeExpr(new), ty.dtype, ty.vdevice)


_SLICE = "relax.strided_slice"


def _is_prim(expr: relax.Expr) -> bool:
    """A TIR integer expression (``n``, ``n + 1``, ``512``), not a Relax value."""
    return str(getattr(expr, "ty", "")).startswith(("int", "uint"))


def _prim_values(expr: relax.Expr) -> list[relax.Expr] | None:
    if not isinstance(expr, relax.Tuple) or not all(_is_prim(f) for f in expr.fields):
        return None
    return list(expr.fields)


def inbound_slice(call: relax.Call, analyzer: sym.Analyzer) -> relax.Call | None:
    """The same ``strided_slice`` with ``assume_inbound=True`` when the bounds prove
    ``0 <= begin <= end <= dim`` on every sliced axis with unit strides, else None.

    Without it, inference clamps the end to the dim (``min(n, 512)``); with it proven, the
    slice has exactly ``end - begin`` rows and the clamp is a no-op on every binding."""
    if not isinstance(call.op, tvm.ir.Op) or call.op.name != _SLICE or call.attrs.assume_inbound:
        return None
    data = call.args[0]
    if not isinstance(data.ty, relax.TensorType) or not isinstance(data.ty.shape, relax.ShapeExpr):
        return None
    axes, begin, end = (_prim_values(a) for a in call.args[1:4])
    strides = _prim_values(call.args[4]) if len(call.args) > 4 else [tirx.IntImm("int64", 1)] * len(axes or [])
    if axes is None or begin is None or end is None or strides is None:
        return None
    dims = data.ty.shape.values
    for axis, lo, hi, step in zip(axes, begin, end, strides):
        if not isinstance(axis, tirx.IntImm) or not (isinstance(step, tirx.IntImm) and step.value == 1):
            return None
        dim = dims[axis.value % len(dims)]
        if not all(analyzer.can_prove(c) for c in (lo >= 0, lo <= hi, hi <= dim)):
            return None
    return relax.op.strided_slice(data, list(axes), list(begin), list(end), list(strides),
                                  assume_inbound=True)


@mutator
class _Bounder(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, analyzer: sym.Analyzer) -> None:
        super().__init__(mod)
        self.analyzer = analyzer
        self.changed = False

    def visit_shape_expr_(self, op: relax.ShapeExpr) -> relax.Expr:
        new = [self.analyzer.simplify(d) for d in op.values]
        if all(tvm_ffi.structural_equal(a, b) for a, b in zip(op.values, new)):
            return op
        self.changed = True
        return relax.ShapeExpr(new)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        inbound = inbound_slice(call, self.analyzer)
        if inbound is None:
            return call
        self.changed = True
        return inbound


@tvm.transform.module_pass(opt_level=0, name="BoundShapes")
class BoundShapes:
    """Simplify the symbolic shapes of every bounded Relax function under its bounds."""

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function):
                continue
            analyzer = bound_analyzer(func)
            if analyzer is None:
                continue
            bounder = _Bounder(mod, analyzer)
            new = bounder.visit_expr(func)
            if bounder.changed:
                body_ty = _simplify_type(new.body.ty, analyzer) or new.body.ty
                updates[gv] = relax.Function(new.params, new.body, body_ty, new.is_pure, new.attrs)
        mod = mod.clone() if updates else mod  # the caller's module stays as it was
        for gv, func in updates.items():
            mod[gv] = func
        return relax.transform.Normalize()(mod) if updates else mod


__all__ = ["BoundShapes", "bound_analyzer", "bounds_of"]
