"""Default TensorIR schedule rules for LLVM CPU targets (dlight style).

Order of use: VNNIMatmul, Gemm, VNNIConv2d, BlockedConv2d, Depthwise, Conv2d, Attention, BlockedNorm,
FullMinMax, Reduction, Elementwise, Fallback (each returns None for a PrimFunc it does not handle).  ``VectorizeMath``
runs after them: it turns the
float32 transcendental calls of vectorized loops into SIMD arithmetic (``vector_math``).
"""

from .attention import Attention
from .conv2d import Conv2d
from .conv2d_blocked import BlockedConv2d
from .conv2d_int8 import VNNIConv2d, VNNIMatmul
from .depthwise import Depthwise
from .elementwise import Elementwise
from .fallback import Fallback
from .full_minmax import FullMinMax
from .gemm import Gemm
from .norm_blocked import BlockedNorm
from .reduction import Reduction
from .vector_math import VectorizeMath

__all__ = ["Attention", "BlockedConv2d", "BlockedNorm", "Conv2d", "Depthwise", "Elementwise", "Fallback",
           "FullMinMax", "Gemm", "Reduction", "VNNIConv2d", "VNNIMatmul", "VectorizeMath"]
