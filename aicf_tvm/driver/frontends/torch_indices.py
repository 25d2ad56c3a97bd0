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

from tvm import relax

from relax_passes.index_checks import IndexChecker
from relax_passes.normalize_indices import describe_tensor

if TYPE_CHECKING:
    import torch
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    Converter = Callable[[torch.fx.Node, ExportedProgramImporter], relax.Var]


def _checker(importer: ExportedProgramImporter) -> IndexChecker:
    bb = importer.block_builder
    inputs = [v for node, v in importer.env.items()
              if getattr(node, "op", None) == "placeholder" and isinstance(v, relax.Var)]
    return IndexChecker(bb, bb.lookup_binding, inputs, from_end=False)


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


def index_converters() -> dict[str, Converter]:
    """``custom_convert_map`` entries for the ops that refuse negative indices."""
    return {"embedding.default": _embedding, "index_select.default": _index_select,
            "gather.default": _gather}


__all__ = ["index_converters"]
