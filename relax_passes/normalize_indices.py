"""NormalizeIndices: every gather reads in bounds or raises (take, gather_elements, gather_nd,
index_tensor).

``take(mode="fast")``, ``gather_elements``, ``gather_nd`` and ``index_tensor`` address
memory with the raw index: a negative index, which PyTorch and ONNX define as counting
from the end, or any index past the end reads out of bounds. Frontends emit them for
exactly such indexing: Falcon's ``fused_qkv[..., [-2], :]`` became ``take(mode="fast")``
with index -2 and read the bytes before the tensor; an embedding called with token id 150
of 100 read past its table.

Per call, on op-level Relax (in the importers, and in ``compile``'s normalize):

* indices that are constants, on an axis of static size ``n``: decided at compile time.
  Under ``fast`` (no mode: the gathers) an index in ``[-n, n)`` becomes ``i mod n``; one
  outside is an ``UnsupportedModelError`` naming the op (PyTorch and ONNX reject it too).
  A take under ``wrap``/``clip`` has the mode applied to the constant. So are checks
  (below) of indices that are constants by now (the importers run this pass before
  ``FoldConstant``; ``normalize`` runs it after).
* indices proven in ``[0, n)``: left as they are. The proof follows views (expand_dims,
  reshape, broadcast_to, squeeze, permute_dims), casts that keep the values and ``+ 0``
  back to ``arange(0, m, 1)`` with ``m <= n`` (PyTorch's mask builders index a
  ``[batch, seq]`` mask by ``arange(batch)`` and ``arange(seq)``), or to a check kernel's
  result (below) for an extent ``<= n``.
* any other indices get a check kernel (``relax_passes.index_checks``): at run time an
  index outside ``[-n, n)`` raises ``InputError`` naming it and the bound, and negative
  ones are counted from the end. The check reads the indices' source: back through views
  and integer casts whose dtype holds every index in range (TVM's PyTorch frontend casts
  token ids to int32 before its take: id 2**32 + 1 must be refused, not read as 1), and
  through ONNX's ``where(i < 0, i + n, i)``, which counts from the end itself.
  ``NormalizeIndices(from_end=False)`` rejects negative indices instead (the PyTorch
  importer checks embedding, index_select and gather indices so, as PyTorch does).
* a take on indices in range reads them in ``clip`` mode: the same elements as ``fast``,
  without TVM's warning that ``fast`` reads out of bounds. ``take(mode="nan")``,
  ``wrap`` and ``clip`` on other indices define every index: left alone.

Sound: for an index in ``[-n, n)`` the element read is the one PyTorch and ONNX read; they
define no result for other indices (they raise), and so do we, before the gather runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from aicf_tvm.errors import UnsupportedModelError

from .index_checks import checked_extents, emit_checked, folded_check

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


def holds_range(dtype: str, extents: list[Extent]) -> bool:
    """Whether integer ``dtype`` holds every index in ``[-n, n)`` of each extent (symbolic
    extents: only 64-bit signed dtypes do)."""
    if not dtype.startswith("int"):
        return False
    bits = int(dtype[3:])
    static = static_extents(extents)
    return bits >= 64 or (static is not None and all(n <= 2 ** (bits - 1) for n in static))


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


def _dims(shape: list[Extent]) -> list:
    return [int(d) if isinstance(d, tirx.IntImm) else str(d) for d in shape]


def describe_tensor(expr: relax.Expr) -> str:
    """``a float32 [100, 16] tensor``: an operand as error messages name it."""
    shape = _shape(expr)
    dims = ", ".join(str(d) for d in _dims(shape)) if shape is not None else "?"
    return f"a {expr.ty.dtype} [{dims}] tensor"


# Ops whose every output element is an element of their first operand.
_VALUE_VIEWS = frozenset({"relax.expand_dims", "relax.reshape", "relax.broadcast_to", "relax.squeeze",
                          "relax.permute_dims"})


class IndexChecker:
    """Emits the checks of gather indices into ``bb`` (module docstring); ``lookup`` gives
    a var's bound value, ``params`` are the function's inputs (named in messages)."""

    def __init__(self, bb: relax.BlockBuilder, lookup: Callable[[relax.Var], Any], params: list,
                 from_end: bool = True) -> None:
        self.bb, self.lookup, self.params, self.from_end = bb, lookup, params, from_end

    def checked(self, indices: relax.Expr, extents: list[Extent], op: str) -> relax.Expr:
        """``indices`` themselves when proven in ``[0, extents)``, else their check."""
        if self.in_range(indices, extents):
            return indices
        src, views, from_end = self._source(indices, extents, self.from_end)
        named = next((p.name for p in self.params if p.same_as(src)), None)
        what = op.split(" ")[0]
        subject = f"input {named}" if named else f"the indices of {what} (computed in the model)"
        out = emit_checked(self.bb, src, extents, str(indices.ty.dtype), from_end, subject, op)
        for view in views:  # the same views of the checked values
            out = self.bb.emit(relax.Call(view.op, [out, *view.args[1:]], view.attrs, view.ty_args))
        return out

    def in_range(self, indices: relax.Expr, extents: list[Extent]) -> bool:
        """Whether every index is proven in ``[0, extents[j])``: an arange within the extent
        or a check against extents no larger, through views (one extent only) and casts."""
        value = self._value(indices)
        proven = checked_extents(value, self.bb.get(), self.lookup)
        if proven is not None:
            return len(proven) == len(extents) and all(
                tvm.sym.Analyzer().can_prove(a <= b) for a, b in zip(proven, extents))
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return False
        name = value.op.name
        if name == "relax.astype" and holds_range(str(value.ty.dtype), extents):
            return self.in_range(value.args[0], extents)
        if len(extents) != 1:
            return False
        if name in _VALUE_VIEWS or (name == "relax.add" and _is_int_zero(value.args[1])):
            return self.in_range(value.args[0], extents)
        if name == "relax.arange" and len(value.args) == 3:
            start, end, step = value.args
            return (_is_int(start, 0) and _is_int(step, 1) and str(end.ty).startswith("int")
                    and tvm.sym.Analyzer().can_prove(end <= extents[0]))
        return False

    def _source(self, indices: relax.Expr, extents: list[Extent],
                from_end: bool) -> tuple[Any, list, bool]:
        """The tensor to check for ``indices`` (module docstring), the views from it to them
        in order, and whether its negative indices count from the end."""
        value = self._value(indices)
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return indices, [], from_end
        name = value.op.name
        if name == "relax.astype" and holds_range(str(value.ty.dtype), extents) and \
                str(value.args[0].ty.dtype).startswith(("int", "uint")):
            return self._source(value.args[0], extents, from_end)
        counted = self._counted_from_end(value, extents)
        if counted is not None:
            return self._source(counted, extents, True)
        if name in _VALUE_VIEWS and len(extents) == 1:
            src, views, fe = self._source(value.args[0], extents, from_end)
            return src, [*views, value], fe
        return indices, [], from_end

    def _counted_from_end(self, value: relax.Call, extents: list[Extent]) -> relax.Expr | None:
        """``i`` when ``value`` is ``where(i < 0, i + n, i)`` with ``n`` the (static) extents
        (ONNX's Gather, GatherElements and GatherND count negative indices so), else None."""
        static = static_extents(extents)
        if value.op.name != "relax.where" or static is None:
            return None
        cond, added = self._value(value.args[0]), self._value(value.args[1])
        src = value.args[2]
        if not (_is_call(cond, "relax.less") and _is_call(added, "relax.add")
                and _is_int_zero(cond.args[1])
                and cond.args[0].same_as(src) and added.args[0].same_as(src)
                and isinstance(added.args[1], tvm.ir.Constant)):
            return None
        n = added.args[1].value.numpy()
        wanted = np.array(static if len(static) > 1 else static[0])
        if n.size == 0 or n.ndim > 1 or (n.ndim == 1 and n.shape[0] not in (1, wanted.size)):
            return None
        n = np.broadcast_to(n, np.broadcast_shapes(n.shape, wanted.shape))
        return src if np.all(n == wanted) else None

    def _value(self, expr: relax.Expr) -> Any:
        return self.lookup(expr) if isinstance(expr, relax.Var) else expr


@mutator
class _IndexNormalizer(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, params: list, from_end: bool) -> None:
        super().__init__(mod)
        self.checker = IndexChecker(self.builder_, self.lookup_binding, params, from_end)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        # a check of indices constant by now (FoldConstant ran): decided here
        folded = folded_check(call, self.builder_.get(), self.lookup_binding)
        if folded is not None:
            return folded
        if not isinstance(call.op, tvm.ir.Op) or call.op.name not in _RULES:
            return call
        return _RULES[call.op.name](self.checker, call)


def _is_call(value: Any, op: str) -> bool:
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == op


def _is_int(expr: Any, value: int) -> bool:
    return isinstance(expr, tirx.IntImm) and int(expr.value) == value


def _is_int_zero(expr: relax.Expr) -> bool:
    """An integer constant whose every element is 0."""
    if not isinstance(expr, tvm.ir.Constant) or not str(expr.ty.dtype).startswith(("int", "uint")):
        return False
    return not np.any(expr.value.numpy())


def _take(checker: IndexChecker, call: relax.Call) -> relax.Expr:
    data, indices = call.args
    axis, mode = call.attrs.axis, str(call.attrs.mode)
    shape = _shape(data)
    if mode == "nan" or shape is None:
        return call
    extent = shape[int(axis)] if axis is not None else _product(shape)  # no axis: the flattened data
    static = static_extents([extent])
    if isinstance(indices, tvm.ir.Constant) and static is not None:
        fixed = resolve_constant(indices.value.numpy(), static, mode, "take")
        return relax.op.take(data, _const(fixed), axis, mode="clip")
    if mode != "fast" and not checker.in_range(indices, [extent]):
        return call  # the mode defines every index
    where = f"along axis {int(axis)}" if axis is not None else "of the flattened"
    op = f"take {where} of {describe_tensor(data)}"
    return relax.op.take(data, checker.checked(indices, [extent], op), axis, mode="clip")


def _gather_elements(checker: IndexChecker, call: relax.Call) -> relax.Expr:
    data, indices = call.args
    shape = _shape(data)
    if shape is None:
        return call
    axis = int(call.attrs.axis)
    op = f"gather_elements along axis {axis} of {describe_tensor(data)}"
    checked = _fix(checker, indices, [shape[axis % len(shape)]], op)
    return relax.op.gather_elements(data, checked, axis)


def _gather_nd(checker: IndexChecker, call: relax.Call) -> relax.Expr:
    data, indices = call.args
    shape, ishape = _shape(data), _shape(indices)
    batch = int(call.attrs.batch_dims)
    if shape is None or ishape is None or static_extents(ishape[-1:]) is None:
        return call
    extents = shape[batch:batch + int(ishape[-1])]
    op = f"gather_nd of {describe_tensor(data)}"
    return relax.op.gather_nd(data, _fix(checker, indices, extents, op), batch)


def _index_tensor(checker: IndexChecker, call: relax.Call) -> relax.Expr:
    data, indices = call.args
    shape = _shape(data)
    if shape is None or not isinstance(indices, relax.Tuple):
        return call
    fixed = [_fix(checker, idx, [shape[k]], f"index_tensor on axis {k} of {describe_tensor(data)}")
             for k, idx in enumerate(indices.fields)]
    return relax.op.index_tensor(data, relax.Tuple(fixed))


def _scatter_elements(checker: IndexChecker, call: relax.Call) -> relax.Expr:
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


def _fix(checker: IndexChecker, indices: relax.Expr, extents: list[Extent], op: str) -> relax.Expr:
    static = static_extents(extents)
    if isinstance(indices, tvm.ir.Constant) and static is not None:
        return _const(resolve_constant(indices.value.numpy(), static, "fast", op.split(" ")[0]))
    return checker.checked(indices, extents, op)


_RULES: dict[str, Callable[[IndexChecker, relax.Call], relax.Expr]] = {
    "relax.take": _take,
    "relax.gather_elements": _gather_elements,
    "relax.gather_nd": _gather_nd,
    "relax.index_tensor": _index_tensor,
    "relax.scatter_elements": _scatter_elements,
}


@tvm.transform.module_pass(opt_level=0, name="NormalizeIndices")
class NormalizeIndices:
    """Make every take/gather read in bounds or raise (module docstring). ``from_end``:
    whether negative indices count from the end (else they are out of range)."""

    def __init__(self, from_end: bool = True) -> None:
        self.from_end = from_end

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        for gv, func in list(mod.functions_items()):
            if not isinstance(func, relax.Function) or "Primitive" in (func.attrs or {}):
                continue
            normalizer = _IndexNormalizer(mod, list(func.params), self.from_end)
            new = normalizer.visit_expr(func)
            if not new.same_as(func):
                normalizer.builder_.update_func(gv, new)
                mod = normalizer.builder_.get()
        return mod
