"""NormalizeIndices: every gather reads in bounds or raises (take, gather_elements, gather_nd,
index_tensor), every scatter writes in bounds or raises (scatter_elements, scatter_nd,
index_put).

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

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from aicf_tvm.core.errors import UnsupportedModelError

from .index_checks import Extent, IndexChecker, folded_check, static_extents


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


def _dims(shape: list[Extent]) -> list:
    return [int(d) if isinstance(d, tirx.IntImm) else str(d) for d in shape]


def describe_tensor(expr: relax.Expr) -> str:
    """``a float32 [100, 16] tensor``: an operand as error messages name it."""
    shape = _shape(expr)
    dims = ", ".join(str(d) for d in _dims(shape)) if shape is not None else "?"
    return f"a {expr.ty.dtype} [{dims}] tensor"


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
    """Its indices are checked as a gather's (an index past the axis wrote past the data).
    TVM 0.27's scatter_elements kernel places an update wrongly when the indices are
    smaller than the data on an axis other than ``axis`` (its offsets use the data's
    extents to unflatten the indices' positions). Such a scatter runs on the region of the
    data its indices cover (``[0, ishape[k])`` off the axis, where the kernel is right), and
    the rest of the data is concatenated back around it, axis by axis: the same elements
    written. Symbolic extents that differ cannot be sliced so: refused, not miscomputed."""
    data, indices, updates = call.args
    shape, ishape = _shape(data), _shape(indices)
    if shape is None or ishape is None:
        return call
    rank = len(shape)
    axis = int(call.attrs.axis) % rank
    narrow = [k for k, (dim, idim) in enumerate(zip(shape, ishape))
              if k != axis and static_extents([dim]) != static_extents([idim])]
    if any(static_extents([shape[k], ishape[k]]) is None for k in narrow):
        raise UnsupportedModelError(
            f"scatter_elements along axis {axis} with indices of shape {_dims(ishape)} on data of "
            f"shape {_dims(shape)}: symbolic extents of the indices smaller than the data's off "
            "the axis are not supported")
    op = f"scatter_elements along axis {axis} into {describe_tensor(data)}"
    checked = _fix(checker, indices, [shape[axis]], op)
    reduction = str(call.attrs.reduction)
    if not narrow:
        return relax.op.scatter_elements(data, checked, updates, int(call.attrs.axis), reduction)
    bb = checker.bb
    extents = [int(ishape[k]) if k in narrow else shape[k] for k in range(rank)]
    region = bb.emit(relax.op.strided_slice(data, list(range(rank)), [0] * rank, extents))
    result = bb.emit(relax.op.scatter_elements(region, checked, updates, axis, reduction))
    for k in narrow:  # grow the result back to the data's extent on axis k
        begin = [int(ishape[k]) if j == k else 0 for j in range(rank)]
        end = [shape[k] if j == k else extents[j] for j in range(rank)]
        rest = bb.emit(relax.op.strided_slice(data, list(range(rank)), begin, end))
        result = bb.emit(relax.op.concat([result, rest], axis=k))
        extents[k] = shape[k]
    return result


def _scatter_nd(checker: IndexChecker, call: relax.Call) -> relax.Expr:
    """The last axis of its indices holds a coordinate per leading axis of the data."""
    data, indices, updates = call.args
    shape, ishape = _shape(data), _shape(indices)
    if shape is None or ishape is None or static_extents(ishape[-1:]) is None:
        return call
    op = f"scatter_nd into {describe_tensor(data)}"
    checked = _fix(checker, indices, shape[:int(ishape[-1])], op)
    return relax.op.scatter_nd(data, checked, updates, str(call.attrs.reduction))


def _index_put(checker: IndexChecker, call: relax.Call) -> relax.Expr:
    data, indices, values = call.args
    shape = _shape(data)
    if shape is None or not isinstance(indices, relax.Tuple):
        return call
    fixed = [_fix(checker, idx, [shape[k]], f"index_put on axis {k} of {describe_tensor(data)}")
             for k, idx in enumerate(indices.fields)]
    return relax.op.index_put(data, relax.Tuple(fixed), values, bool(call.attrs.accumulate))


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
    "relax.scatter_nd": _scatter_nd,
    "relax.index_put": _index_put,
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
