"""Default TensorIR schedule rules for LLVM CPU targets (dlight style).

Order of use: Gemm, Depthwise, Conv2d, Reduction, Elementwise, Fallback (each returns None for a
PrimFunc it does not handle).
"""

from .conv2d import Conv2d
from .depthwise import Depthwise
from .elementwise import Elementwise
from .fallback import Fallback
from .gemm import Gemm
from .reduction import Reduction

__all__ = ["Conv2d", "Depthwise", "Elementwise", "Fallback", "Gemm", "Reduction"]
