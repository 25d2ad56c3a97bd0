"""What every importer does to the module TVM's frontend hands back."""

from __future__ import annotations

import tvm
from tvm import relax

from relax_passes.bound_shapes import BoundShapes
from relax_passes.creation_ops import NormalizeCreationOps
from relax_passes.narrow_constants import keep_narrow
from relax_passes.normalize_indices import NormalizeIndices


def normalize_import(mod: tvm.IRModule) -> tvm.IRModule:
    """Simplify shapes under their bounds, make every gather read in bounds or raise, fold
    constants, drop dead code.

    ``NormalizeIndices`` runs here, not only in ``compile``: TVM's frontends emit
    ``take(mode="fast")`` for indexing that PyTorch and ONNX define with negative
    indices, so the imported module is only right for any pipeline once it ran. It runs
    before ``FoldConstant``, which folds a take of constants (a position table indexed by
    ``arange``) through TVM's legalization, and that warns of every ``fast`` take.
    """
    # bounds first: a shape left unknown by inference cannot be folded or legalized
    # creation ops first: TVM types a descending arange and legalizes a -inf full wrongly
    # a widening cast of a narrow constant (a quantized weight) stays a cast, and a dequantized
    # one a dequantize (for relax_passes.integer_qdq): relax_passes.narrow_constants
    mod = tvm.transform.Sequential([NormalizeCreationOps(), BoundShapes(), NormalizeIndices()])(mod)
    return relax.transform.DeadCodeElimination()(keep_narrow(relax.transform.FoldConstant(), mod, dequantized=True))


def whole_message(err: BaseException) -> str:
    """``err``'s message as it was written, all its lines: torch.export's guard errors put
    the guard that failed and its suggested fix on the lines after the first."""
    return str(err).strip() or type(err).__name__


def first_line(err: BaseException) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[0][:300] if lines else type(err).__name__
