"""CPU conv2d schedule rule: implicit GEMM (im2col packed in-kernel) on the GEMM kernel.

Accepts a static-shape PrimFunc whose single reduction block is a convolution as TOPI
writes it (``out[n, f, y, x] += pad[n, c, y*s + r, x*s + q] * w[f, c, r, q]``; NCHW/OIHW,
any stride and padding, dilation 1, depthwise), with injective producers (the padding
block) and consumers (bias ``[1, C, 1, 1]``, relu, residual add). Grouped convolutions
with more than one input channel per group index the input as ``f // g * c_g + c``, which
im2col would replicate per output channel: they get None (as do non-convolutions).

``gemm_analysis.normalize_gemm`` turns the block into ``C[S, M, N] += A[S, M, K] * B[S, N, K]``
with K = (c, r, q); the vectorised N axis is either the output channels (im2col rows are
the A operand, the weight is packed) or, by default, the output positions y*W + x (the
weight is A and read in place; B *is* the im2col buffer, stored K-major ``[K, y*W + x]`` so
that its copy and the kernel's vector loads both walk rows of the input).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.target import Target

from .gemm import find_reduction_block, looks_like_convolution, schedule_gemm
from .gemm_analysis import IterRole, detect_gemm


def channel_role(block: s_tir.SBlock) -> IterRole:
    """The GEMM role (I or J) of the output channels: that of the operand read plainly."""
    input_first = any(
        not isinstance(rng.min, (tirx.Var, tirx.IntImm)) for rng in block.reads[0].region
    )
    return IterRole.J if input_first else IterRole.I


class Conv2d(CPUScheduleRule):
    """Default CPU schedule for a (fused) NCHW conv2d PrimFunc; None when not one.

    ``vector_axis``: ``"positions"`` (default: the output's y*W + x) or ``"channels"``.
    """

    def __init__(self, vector_axis: str = "positions") -> None:
        if vector_axis not in ("channels", "positions"):
            raise ValueError(f"Conv2d(vector_axis={vector_axis!r}): use 'positions' or 'channels'")
        self.vector_axis = vector_axis

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        main = find_reduction_block(sch)
        if main is None or not looks_like_convolution(sch.get(main)):
            return None
        traits = detect_gemm(sch.get(main))
        if traits is None:
            return None
        channels = channel_role(sch.get(main))
        positions = IterRole.I if channels == IterRole.J else IterRole.J
        # Measured on ResNet-50/SqueezeNet layers (2 cores): vectorising positions ran
        # 1.1-3x faster than channels on every shape, 7x7 maps included, because the weight
        # is then read in place and the epilogue writes NCHW rows without a transpose.
        if self.vector_axis == "channels" and channels in traits.block:
            role = channels
        elif positions in traits.block:
            role = positions
        else:
            role = channels
        try:
            schedule_gemm(sch, main, traits, role, target)
        except (RuntimeError, ValueError):  # ScheduleError / InternalError: not our shape
            return None
        return sch
