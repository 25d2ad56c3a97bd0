"""PyTorch ops that refuse negative indices: their indices are checked as they are imported.

``embedding``, ``index_select`` and ``gather`` raise in PyTorch on an index below 0 (an
embedding of id -1 is ``IndexError: index out of range in self``), where advanced
indexing (``x[idx]``, also a Relax ``take``) counts it from the end. TVM's translator
turns both into the same Relax ops, so the difference is decided here, while the FX op is
still known: these converters (``from_exported_program``'s ``custom_convert_map``) put
``relax_passes.normalize_indices``' check in front of the op with negative indices out of
range (``from_end=False``), then build the op as TVM's translator does. ``NormalizeIndices``
later finds the indices checked and leaves them; every other gather keeps PyTorch's
count-from-the-end reading.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import tvm_ffi
from tvm import relax

from relax_passes.index_checks import IndexChecker
from relax_passes.normalize_indices import describe_tensor

if TYPE_CHECKING:
    import torch
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    Converter = Callable[[torch.fx.Node, ExportedProgramImporter], relax.Var]


def _checker(importer: ExportedProgramImporter, from_end: bool = False) -> IndexChecker:
    """Checks of indices against their extents; ``from_end``: negative ones count from the
    end (advanced indexing) instead of being refused (the ops of the module docstring)."""
    bb = importer.block_builder
    inputs = [v for node, v in importer.env.items()
              if getattr(node, "op", None) == "placeholder" and isinstance(v, relax.Var)]
    return IndexChecker(bb, bb.lookup_binding, inputs, from_end=from_end)


def _axis_of(node: torch.fx.Node, data: relax.Expr) -> int:
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    return int(dim) % data.ty.ndim


def _embedding(node: torch.fx.Node, importer: ExportedProgramImporter) -> relax.Var:
    weight, ids = importer.env[node.args[0]], importer.env[node.args[1]]
    rows = weight.ty.shape.values[0]
    ids = _checker(importer).checked(ids, [rows], f"embedding of {describe_tensor(weight)}")
    return importer._embedding_impl(ids, weight)


def _index_select(node: torch.fx.Node, importer: ExportedProgramImporter) -> relax.Var:
    data, index = importer.env[node.args[0]], importer.env[node.args[2]]
    axis = _axis_of(node, data)
    index = _checker(importer).checked(index, [data.ty.shape.values[axis]],
                                       f"index_select along axis {axis} of {describe_tensor(data)}")
    return importer.block_builder.emit(relax.op.take(data, index, axis, mode="clip"))


def _gather(node: torch.fx.Node, importer: ExportedProgramImporter) -> relax.Var:
    data, index = importer.env[node.args[0]], importer.env[node.args[2]]
    axis = _axis_of(node, data)
    index = _checker(importer).checked(index, [data.ty.shape.values[axis]],
                                       f"gather along axis {axis} of {describe_tensor(data)}")
    return importer.block_builder.emit(relax.op.gather_elements(data, index, axis=axis))


def _index_tensor(node: torch.fx.Node, importer: ExportedProgramImporter) -> relax.Var:
    """Advanced indexing ``x[..., i, j, ...]`` by integer index tensors (``F.unfold``
    exports as one), by NumPy's rules, which TVM's translator gets wrong when the index
    shapes broadcast: the index tensors broadcast together; when they index consecutive
    axes the result has their broadcast shape in place of those axes, else in front (the
    indexed axes moved to the front first). Each index is checked against its axis (from
    the end when negative, as PyTorch counts), combined into one row-major index over the
    indexed axes, and taken from ``x`` with those axes merged. Boolean masks (a result
    whose shape depends on the data) are left to TVM's translator."""
    data = importer.env[node.args[0]]
    indices = [None if i is None else importer.env[i] for i in node.args[1]]
    shape = getattr(data.ty, "shape", None)
    if (not isinstance(shape, relax.ShapeExpr) or not any(i is not None for i in indices)
            or any(i is not None and not str(i.ty.dtype).startswith("int") for i in indices)):
        return importer._index_tensor(node)
    bb = importer.block_builder
    dims = list(shape.values)
    axes = [k for k, i in enumerate(indices) if i is not None]
    checker = _checker(importer, from_end=True)
    checked = [bb.emit(relax.op.astype(checker.checked(indices[k], [dims[k]],
                                                        f"index along axis {k} of {describe_tensor(data)}"), "int64"))
               for k in axes]
    if axes != list(range(axes[0], axes[-1] + 1)):  # apart: NumPy puts the broadcast axes first
        order = axes + [k for k in range(len(dims)) if k not in axes]
        data = bb.emit(relax.op.permute_dims(data, order))
        dims = [dims[k] for k in order]
        axes = list(range(len(axes)))
    linear = checked[0]
    for k, index in zip(axes[1:], checked[1:]):
        linear = bb.emit(relax.op.add(relax.op.multiply(linear, _dim(dims[k])), index))
    first, last = axes[0], axes[-1]
    merged = dims[first]
    for d in dims[first + 1:last + 1]:
        merged = merged * d
    flat = bb.emit(relax.op.reshape(data, [*dims[:first], merged, *dims[last + 1:]]))
    return bb.emit(relax.op.take(flat, linear, axis=first, mode="clip"))


def _dim(extent) -> relax.Expr:
    """An axis extent as an int64 scalar tensor (a symbolic one through a shape value)."""
    if hasattr(extent, "value"):
        return relax.const(int(extent.value), "int64")
    return relax.op.shape_to_tensor(relax.ShapeExpr([extent]))


def _index_put(node: torch.fx.Node, importer: ExportedProgramImporter) -> relax.Var:
    """``x[mask] = v`` (``x[mask] += v`` with ``accumulate``) for a boolean mask over the
    leading axes of ``x`` and one value: ``where(mask, v, x)`` (``where(mask, x + v, x)``),
    which TVM's translator refuses (it takes integer indices only). A tensor of values, one
    per masked element, has a shape that depends on the data: refused by name. Other
    ``index_put`` calls go to TVM's translator."""
    data, indices = importer.env[node.args[0]], node.args[1]
    values = importer.env[node.args[2]] if isinstance(node.args[2], type(node)) else node.args[2]
    accumulate = bool(node.args[3]) if len(node.args) > 3 else bool(node.kwargs.get("accumulate", False))
    if len(indices) != 1 or indices[0] is None or str(importer.env[indices[0]].ty.dtype) != "bool":
        return importer._index_put(node)
    mask = importer.env[indices[0]]
    bb = importer.block_builder
    rank, mask_rank = data.ty.ndim, mask.ty.ndim
    if not isinstance(values, relax.Expr):
        values = relax.const(values, str(data.ty.dtype))
    value_shape = getattr(values.ty, "shape", None)
    one = isinstance(value_shape, relax.ShapeExpr) and all(
        hasattr(d, "value") and int(d.value) == 1 for d in value_shape.values)
    if not one:
        raise ValueError(f"x[mask] = values with a tensor of values ({describe_tensor(values)}): the values "
                         f"fill the masked elements in order, a shape that depends on the data; only one value "
                         f"(x[mask] = 0.0) is supported")
    if mask_rank > rank or not all(tvm_ffi.structural_equal(a, b) for a, b in
                                   zip(mask.ty.shape.values, data.ty.shape.values[:mask_rank])):
        return importer._index_put(node)  # a mask not over x's leading axes: TVM's error
    value = bb.emit(relax.op.reshape(relax.op.astype(values, str(data.ty.dtype)), []))
    if mask_rank < rank:  # a mask over the leading axes covers the rest of each
        mask = bb.emit(relax.op.reshape(mask, [*mask.ty.shape.values, *[1] * (rank - mask_rank)]))
    new = bb.emit(relax.op.add(data, value)) if accumulate else value
    return bb.emit(relax.op.where(mask, new, data))


def _as_strided(node: torch.fx.Node, importer: ExportedProgramImporter) -> relax.Var:
    """``as_strided`` with strides that are not a contiguous layout's (Longformer's
    overlapping chunks), which TVM's translator refuses: each output element is the
    operand's element at storage position ``offset + sum(i_j * stride_j)``: one ``take`` of
    the operand, its axes in storage order (a dense view: contiguous or transposed),
    flattened, by those constant positions. Only for constant sizes and strides whose every
    position lies within the operand; anything else goes to TVM's translator."""
    import numpy as np

    args = importer.retrieve_args(node)
    data, size, stride = args[0], args[1], args[2]
    offset = args[3] if len(args) > 3 else node.kwargs.get("storage_offset", 0)
    val = node.args[0].meta.get("val") if hasattr(node.args[0], "meta") else None
    numbers = [*size, *stride, offset or 0]
    shape = getattr(data.ty, "shape", None)
    if (val is None or not all(isinstance(v, int) for v in numbers) or not isinstance(shape, relax.ShapeExpr)
            or not all(hasattr(d, "value") for d in shape.values)):
        return importer._as_strided(node)
    # the operand in the order of its storage (a transposed view of a dense tensor too)
    order = sorted(range(val.dim()), key=lambda k: -int(val.stride(k)))
    step = 1
    for k in reversed(order):  # dense: each axis steps over the axes stored inside it
        if int(val.shape[k]) != 1 and int(val.stride(k)) != step:
            return importer._as_strided(node)
        step *= int(val.shape[k])
    bb = importer.block_builder
    if order != list(range(val.dim())):
        data = bb.emit(relax.op.permute_dims(data, order))
    numel = int(np.prod([int(d.value) for d in shape.values]))
    positions = np.full([int(d) for d in size], int(offset or 0) - int(val.storage_offset()), np.int64)
    for axis, (extent, step) in enumerate(zip(size, stride)):
        view = [1] * len(size)
        view[axis] = extent
        positions = positions + np.arange(extent, dtype=np.int64).reshape(view) * step
    if positions.size and (positions.min() < 0 or positions.max() >= numel):
        return importer._as_strided(node)  # past the operand: TVM's error
    flat = bb.emit(relax.op.reshape(data, [numel]))
    return bb.emit(relax.op.take(flat, relax.const(positions, "int64"), axis=0, mode="clip"))


def index_converters() -> dict[str, Converter]:
    """``custom_convert_map`` entries for the ops that refuse negative indices, and for the
    indexing TVM's translator gets wrong or refuses (``index.Tensor``, a boolean
    ``index_put``, a strided view that is not a reshape)."""
    return {"embedding.default": _embedding, "index_select.default": _index_select,
            "gather.default": _gather, "index.Tensor": _index_tensor, "index_put.default": _index_put,
            "as_strided.default": _as_strided}


__all__ = ["index_converters"]
