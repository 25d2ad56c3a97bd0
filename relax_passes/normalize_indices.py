"""NormalizeIndices: every gather reads in bounds (take, gather_elements, gather_nd, index_tensor).

``take(mode="fast")``, ``gather_elements``, ``gather_nd`` and ``index_tensor`` address
memory with the raw index: a negative index, which PyTorch and ONNX define as counting
from the end, or any index past the end reads out of bounds. Frontends emit them for
exactly such indexing: Falcon's ``fused_qkv[..., [-2], :]`` became ``take(mode="fast")``
with index -2 and read the bytes before the tensor.

Per call, on op-level Relax (in the importers, and in ``compile``'s normalize):

* indices that are constants, on an axis of static size ``n``: decided at compile time.
  Under ``fast`` (no mode: the gathers) an index in ``[-n, n)`` becomes ``i mod n``; one
  outside is an ``UnsupportedModelError`` naming the op (PyTorch and ONNX reject it too).
  A take under ``wrap``/``clip`` has the mode applied to the constant. The result is a
  take in ``fast`` mode: its indices are proven in range.
* indices proven in ``[0, n)``: left as they are.  The proof follows views (expand_dims,
  reshape, broadcast_to, squeeze, permute_dims) and ``+ 0`` back to ``arange(0, m, 1)``
  with ``m <= n`` (PyTorch's mask builders index a ``[batch, seq]`` mask by
  ``arange(batch)`` and ``arange(seq)``: wrapped, a dynamic-shape build ran six more
  kernels per call for the bound tensors and the ``floor_mod``);
* any other indices: a ``fast`` take becomes ``wrap``; a gather gets its indices wrapped,
  ``floor_mod(indices, n)``, unless they are already (this pass ran before).
* ``take(mode="nan")`` defines every index: left alone.

Sound: for an index in ``[-n, n)`` ``i mod n`` is the element PyTorch and ONNX read; they
define no result for other indices (they raise), for which the kernel now stays in
bounds instead of reading arbitrary memory.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from aicf_tvm.errors import UnsupportedModelError

Extent = int | tvm.ir.Expr


def static_extents(extents: list[Extent | None]) -> list[int] | None:
    """The extents as ints when every one is static, else None."""
    if any(not isinstance(e, (int, tirx.IntImm)) for e in extents):
        return None
    return [int(e) for e in extents]


def resolve_constant(values: np.ndarray, extents: list[int], mode: str, op: str) -> np.ndarray:
    """Constant ``values`` (last axis over ``extents`` when there are several, else all over
    ``extents[0]``) mapped into ``[0, n)`` as ``mode`` defines; out of range under ``fast``
    raises."""
    if values.size == 0:
        return values
    n = np.array(extents if len(extents) > 1 else extents[0], dtype=np.int64)
    wide = values.astype(np.int64)
    if mode == "clip":
        fixed = np.clip(wide, 0, n - 1)
    else:
        if mode == "fast" and ((wide < -n) | (wide >= n)).any():
            bad = wide[(wide < -n) | (wide >= n)].flat[0]
            raise UnsupportedModelError(f"{op}: constant index {bad} is out of range for an axis of size "
                                        f"{extents[0] if len(extents) == 1 else extents}")
        fixed = np.mod(wide, np.where(n == 0, 1, n))
    return fixed.astype(values.dtype)


def _const(values: np.ndarray) -> relax.Expr:
    return relax.const(values, str(values.dtype))


def _shape(expr: relax.Expr) -> list[Extent] | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return list(ty.shape.values)


def _product(shape: list[Extent]) -> Extent:
    size: Extent = 1
    for dim in shape:
        size = size * dim
    return tvm.sym.Analyzer().simplify(size) if not isinstance(size, int) else size


@mutator
class _IndexNormalizer(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name not in _RULES:
            return call
        return _RULES[call.op.name](self, call)

    # --- helpers shared by the rules --------------------------------------------------

    def wrapped(self, indices: relax.Expr, extents: list[Extent]) -> relax.Expr:
        """``floor_mod(indices, extents)`` (broadcast on the last axis when several), or the
        indices themselves when they are that already."""
        if self._is_wrapped(indices, extents) or self._in_range(indices, extents):
            return indices
        dtype = str(indices.ty.dtype)
        static = static_extents(extents)
        if static is not None:
            bound: relax.Expr = _const(np.array(static if len(static) > 1 else static[0], dtype=dtype))
        else:
            bound = self.builder_.emit(relax.op.astype(relax.op.shape_to_tensor(relax.ShapeExpr(extents)), dtype))
            if len(extents) == 1:
                bound = self.builder_.emit(relax.op.reshape(bound, ()))
        return self.builder_.emit(relax.op.floor_mod(indices, bound))

    def _is_wrapped(self, indices: relax.Expr, extents: list[Extent]) -> bool:
        value = self._bound_value(indices)
        if not (isinstance(value, relax.Call) and value.op.same_as(tvm.ir.Op.get("relax.floor_mod"))):
            return False
        bound = self._extents_of(value.args[1])
        return bound is not None and len(bound) == len(extents) and all(
            tvm.sym.Analyzer().can_prove_equal(a, b) for a, b in zip(bound, extents))

    def _in_range(self, indices: relax.Expr, extents: list[Extent]) -> bool:
        """Whether every index is proven in ``[0, extents[0])`` (one extent only)."""
        end = self._arange_end(indices)
        return end is not None and len(extents) == 1 and tvm.sym.Analyzer().can_prove(end <= extents[0])

    def _arange_end(self, expr: relax.Expr) -> tvm.ir.Expr | None:
        """``m`` when every element of ``expr`` is a value of ``arange(0, m, 1)`` (so in
        ``[0, m)``), through views and ``+ 0``; None when that is not proven."""
        value = self._bound_value(expr)
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return None
        name = value.op.name
        if name in _VALUE_VIEWS:
            return self._arange_end(value.args[0])
        if name == "relax.add" and _is_int_zero(value.args[1]):
            return self._arange_end(value.args[0])
        if name == "relax.arange" and len(value.args) == 3:
            start, end, step = value.args
            if _is_int(start, 0) and _is_int(step, 1) and str(end.ty).startswith("int"):
                return end
        return None

    def _bound_value(self, expr: relax.Expr) -> Any:
        return self.lookup_binding(expr) if isinstance(expr, relax.Var) else expr

    def _extents_of(self, expr: relax.Expr) -> list[Extent] | None:
        """The extents a ``wrapped`` bound tensor holds (the forms ``wrapped`` builds)."""
        value = self._bound_value(expr)
        if isinstance(value, tvm.ir.Constant):
            return [int(v) for v in np.atleast_1d(value.value.numpy())]
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return None
        if value.op.name in ("relax.astype", "relax.reshape"):
            return self._extents_of(value.args[0])
        if value.op.name == "relax.shape_to_tensor":
            shape = value.args[0]
            return list(shape.values) if isinstance(shape, relax.ShapeExpr) else None
        return None


# Ops whose every output element is an element of their first operand.
_VALUE_VIEWS = frozenset({"relax.expand_dims", "relax.reshape", "relax.broadcast_to", "relax.squeeze",
                          "relax.permute_dims"})


def _is_int(expr: Any, value: int) -> bool:
    return isinstance(expr, tirx.IntImm) and int(expr.value) == value


def _is_int_zero(expr: relax.Expr) -> bool:
    """An integer constant whose every element is 0."""
    if not isinstance(expr, tvm.ir.Constant) or not str(expr.ty.dtype).startswith(("int", "uint")):
        return False
    return not np.any(expr.value.numpy())


def _take(self: _IndexNormalizer, call: relax.Call) -> relax.Expr:
    data, indices = call.args
    axis, mode = call.attrs.axis, str(call.attrs.mode)
    shape = _shape(data)
    if mode == "nan" or shape is None:
        return call
    extent = shape[int(axis)] if axis is not None else _product(shape)  # no axis: the flattened data
    static = static_extents([extent])
    if isinstance(indices, tvm.ir.Constant) and static is not None:
        fixed = resolve_constant(indices.value.numpy(), static, mode, "take")
        return relax.op.take(data, _const(fixed), axis, mode="fast")
    return relax.op.take(data, indices, axis, mode="wrap") if mode == "fast" else call


def _gather_elements(self: _IndexNormalizer, call: relax.Call) -> relax.Expr:
    data, indices = call.args
    shape = _shape(data)
    if shape is None:
        return call
    extent = [shape[int(call.attrs.axis) % len(shape)]]
    return relax.op.gather_elements(data, _fix(self, indices, extent, "gather_elements"), int(call.attrs.axis))


def _gather_nd(self: _IndexNormalizer, call: relax.Call) -> relax.Expr:
    data, indices = call.args
    shape, ishape = _shape(data), _shape(indices)
    batch = int(call.attrs.batch_dims)
    if shape is None or ishape is None or static_extents(ishape[-1:]) is None:
        return call
    extents = shape[batch:batch + int(ishape[-1])]
    return relax.op.gather_nd(data, _fix(self, indices, extents, "gather_nd"), batch)


def _index_tensor(self: _IndexNormalizer, call: relax.Call) -> relax.Expr:
    data, indices = call.args
    shape = _shape(data)
    if shape is None or not isinstance(indices, relax.Tuple):
        return call
    fixed = [_fix(self, idx, [shape[k]], "index_tensor") for k, idx in enumerate(indices.fields)]
    return relax.op.index_tensor(data, relax.Tuple(fixed))


def _dims(shape: list[Extent]) -> list:
    return [int(d) if isinstance(d, tirx.IntImm) else str(d) for d in shape]


def _scatter_elements(self: _IndexNormalizer, call: relax.Call) -> relax.Expr:
    """TVM 0.27's scatter_elements kernel places an update wrongly when the indices are
    smaller than the data on an axis other than ``axis`` (its offsets use the data's
    extents to unflatten the indices' positions): such a call is refused, not miscomputed."""
    data, indices = call.args[0], call.args[1]
    shape, ishape = _shape(data), _shape(indices)
    if shape is None or ishape is None:
        return call
    axis = int(call.attrs.axis) % len(shape)
    for k, (dim, idim) in enumerate(zip(shape, ishape)):
        if k != axis and not (static_extents([dim]) is not None and static_extents([dim]) == static_extents([idim])):
            raise UnsupportedModelError(
                f"scatter_elements along axis {axis} with indices of shape {_dims(ishape)} on data of shape "
                f"{_dims(shape)}: TVM's kernel places such updates wrongly unless the indices span every other "
                "axis of the data")
    return call


def _fix(self: _IndexNormalizer, indices: relax.Expr, extents: list[Extent], op: str) -> relax.Expr:
    static = static_extents(extents)
    if isinstance(indices, tvm.ir.Constant) and static is not None:
        return _const(resolve_constant(indices.value.numpy(), static, "fast", op))
    return self.wrapped(indices, extents)


_RULES: dict[str, Callable[[_IndexNormalizer, relax.Call], relax.Expr]] = {
    "relax.take": _take,
    "relax.gather_elements": _gather_elements,
    "relax.gather_nd": _gather_nd,
    "relax.index_tensor": _index_tensor,
    "relax.scatter_elements": _scatter_elements,
}


@relax.transform.function_pass(opt_level=0, name="NormalizeIndices")
class NormalizeIndices:
    """Make every take/gather read in bounds (module docstring)."""

    def transform_function(self, func: relax.Function, mod: tvm.IRModule, ctx: Any) -> relax.Function:
        return _IndexNormalizer(mod).visit_expr(func)
