"""NormalizeCreationOps: creation ops that TVM types or legalizes wrongly, in forms it gets
right.

* ``arange(start, end, step)``: Relax infers ``(end - start + step - 1) // step``
  elements, ``ceil((end - start) / step)`` only for a positive step. A descending
  ``arange(n - 1, -1, -1)`` (PyTorch's reversed positions) is typed with ``n + 2``
  elements (``arange(6, -1, -1)``: 9 of 7), so a sum with an ``n``-element tensor loses
  its shape and does not lower, and a constant one is typed longer than its array. TOPI
  and numpy count correctly. An ``arange`` whose step is not proven positive becomes:

  - with constant operands, the constant ``LegalizeOps`` folds it to (``np.arange``),
    typed with its true shape;
  - with integer operands and a step proven negative, ``flip(arange(last, start + 1,
    -step))``, ``length = max(ceil((end - start) / step), 0)`` and ``last = start + step *
    (length - 1)``: the ascending arange is typed with ``length`` elements, and element
    ``i`` of the flip is ``last - step * (length - 1 - i) = start + step * i``, the
    integer TOPI computes before its cast to the dtype (integer arithmetic is exact
    modulo the type's width, on both sides);
  - otherwise (a step of unknown sign, float operands with symbolic ones), an
    ``UnsupportedModelError`` naming the ``arange``, not a wrongly typed tensor.

* ``full`` / ``full_like`` with an infinite or NaN fill: TVM's legalization hands TOPI
  the dtype as a ``PrimType``, and TOPI's check for a non-finite fill raises
  ``TypeError`` on it (the causal mask ``triu(full((n, n), -inf), 1)``). It becomes
  ``broadcast_to`` of the fill (cast to the dtype first where they differ, which is how
  ``full`` converts it): every element is that value, as ``full`` defines.

Facts for the proofs: the parameters' symbolic dims are at least 0 and the function's
``tir_var_*_bound`` attrs hold (``bound_shapes.bound_analyzer``). Runs first on op-level
Relax: in ``normalize_import``, in ``compile`` before the inputs' dim requirements are
derived from ``main``'s types, and in ``aicf_tvm.driver.pipeline.normalize``; the PyTorch
importer applies ``arange_form`` as it converts (a static descending ``arange`` added to
a tensor fails TVM's type check right there). The bindings after a rewrite get their
types inferred again.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import DataTypeCode, relax, sym, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from aicf_tvm.core.errors import UnsupportedModelError

from .bound_shapes import bound_analyzer, bounds_of


def _is_integer(expr: tirx.Expr) -> bool:
    return expr.ty.matches_code(DataTypeCode.INT) or expr.ty.matches_code(DataTypeCode.UINT)


def shape_analyzer(func: relax.Function) -> sym.Analyzer:
    """An analyzer that knows the function's bounds and that its parameters' dims are >= 0."""
    analyzer = bound_analyzer(func) or sym.Analyzer()
    bounded = set(bounds_of(func))
    dims = {d for p in func.params if isinstance(p.ty, relax.TensorType) and p.ty.shape is not None
            for d in p.ty.shape.values if isinstance(d, tirx.Var) and d.name not in bounded}
    for dim in dims:
        analyzer.update(dim, sym.ConstIntBound(0, sym.ConstIntBound.POS_INF))
    return analyzer


def arange_form(call: relax.Call, analyzer: sym.Analyzer) -> relax.Expr | None:
    """``call`` (an ``arange``) in a form typed with its true length, or None when its
    step is proven positive (the inferred length is right already)."""
    if len(call.args) != 3 or not all(tvm.ir.is_prim_expr(a) for a in call.args):
        return None
    start, end, step = call.args
    dtype = str(call.attrs.dtype)
    if analyzer.can_prove(step > 0):
        return None
    constant = all(isinstance(v, (tirx.IntImm, tirx.FloatImm)) for v in (start, end, step))
    if constant and step.value != 0:
        return relax.const(np.arange(start.value, end.value, step.value, dtype=dtype), dtype)
    if not all(_is_integer(v) for v in (start, end, step)) or not analyzer.can_prove(step < 0):
        text = ", ".join(str(v.value) if isinstance(v, (tirx.IntImm, tirx.FloatImm)) else str(v)
                         for v in (start, end, step))
        raise UnsupportedModelError(
            f"arange({text}): its length is known only for a step of known sign and integer "
            "bounds; give the arange a constant step and integer bounds")
    stride = analyzer.simplify(-step)
    length = analyzer.simplify(tirx.floordiv(start - end + stride - 1, stride))
    if not analyzer.can_prove(length >= 0):
        length = tirx.max(length, tirx.const(0, length.ty))
    last = analyzer.simplify(start - stride * (length - 1))
    ascending = relax.op.arange(last, analyzer.simplify(start + 1), stride, dtype=dtype)
    return relax.op.flip(ascending, axis=0)


def fill_form(call: relax.Call) -> relax.Expr | None:
    """``full``/``full_like`` with a non-finite constant fill as ``broadcast_to`` of it;
    None for any other fill."""
    fill = call.args[1]
    if not isinstance(fill, tvm.ir.Constant) or fill.ty.ndim != 0:
        return None
    if not isinstance(call.ty, relax.TensorType):
        return None
    value = fill.value.numpy()
    if value.dtype.kind != "f" or np.isfinite(value):
        return None
    dtype = str(call.ty.dtype)
    if not dtype.startswith(("float", "bfloat")):
        raise UnsupportedModelError(f"{call.op.name}: fill {value} for a {dtype} tensor; "
                                    "an infinite or NaN fill needs a float dtype")
    if str(fill.ty.dtype) != dtype:
        fill = relax.op.astype(fill, dtype)
    if call.op.name == "relax.full":
        return relax.op.broadcast_to(fill, call.args[0])
    like = call.args[0].ty
    shape = like.shape if isinstance(like, relax.TensorType) and like.shape is not None else None
    return relax.op.broadcast_to(fill, relax.op.shape_of(call.args[0]) if shape is None else shape)


_FILLS = ("relax.full", "relax.full_like")


@mutator
class _Creations(PyExprMutator):
    """Rewrites the creation ops; the mutator re-infers the types of the bindings after them."""

    def __init__(self, mod: tvm.IRModule, analyzer: sym.Analyzer) -> None:
        super().__init__(mod)
        self.analyzer = analyzer
        self.changed = False

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        name = call.op.name if isinstance(call.op, tvm.ir.Op) else ""
        if name == "relax.arange":
            found = arange_form(call, self.analyzer)
        else:
            found = fill_form(call) if name in _FILLS else None
        if found is None:
            return call
        self.changed = True
        return found


@relax.transform.function_pass(opt_level=0, name="NormalizeCreationOps")
class NormalizeCreationOps:
    """Rewrite the creation ops TVM gets wrong into forms it gets right (module docstring)."""

    def transform_function(self, func: relax.Function, mod: tvm.IRModule,
                           ctx: tvm.transform.PassContext) -> relax.Function:
        if func.attrs is not None and "Primitive" in func.attrs and int(func.attrs["Primitive"]):
            return func
        creations = _Creations(mod, shape_analyzer(func))
        new = creations.visit_expr(func)
        if not creations.changed:
            return func
        # the body's type, re-inferred: the function's return type may name the old length
        return relax.Function(new.params, new.body, new.body.ty, new.is_pure, new.attrs)


__all__ = ["NormalizeCreationOps", "arange_form", "fill_form", "shape_analyzer"]
