"""CPU conv2d schedule rule: implicit GEMM (im2col packed in-kernel) on the GEMM kernel.

Accepts a PrimFunc (batch and image size may be symbolic) whose single reduction block is a convolution as TOPI
writes it (``out[n, f, y, x] += pad[n, c, y*s + r, x*s + q] * w[f, c, r, q]``; NCHW/OIHW,
any stride and padding, dilation 1, depthwise and grouped), with injective producers (the
padding block) and consumers (bias ``[1, C, 1, 1]``, relu, residual add). A grouped
convolution reads its input at ``f // F_g * C_g + c``: its output-channel iter is split
into (group, channel in group) with ``transform_block_layout`` and the indices simplified,
so the input index becomes ``group * C_g + c`` and the group is the GEMM's batch axis
(one ``F_g x K`` by ``K x positions`` product per group). Non-convolutions get None.

``gemm_analysis.normalize_gemm`` turns the block into ``C[S, M, N] += A[S, M, K] * B[S, N, K]``
with K = (c, r, q); the vectorised N axis is either the output channels (im2col rows are
the A operand, the weight is packed) or, by default, the output positions y*W + x (the
weight is A and read in place; B *is* the im2col buffer, stored K-major ``[K, y*W + x]`` so
that its copy and the kernel's vector loads both walk rows of the input).
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.s_tir.schedule import SBlockRV
from tvm.target import Target

from aicf_tvm.core.options import CompileOptions

from .gemm import gemm_spaces, looks_like_convolution, schedule_gemm
from .gemm_analysis import IterRole, detect_gemm
from .gemm_blocks import find_reduction_block


def _group_divisors(expr: tirx.Expr, found: list) -> list:
    """Every ``iter // constant`` inside ``expr``."""
    if isinstance(expr, tirx.FloorDiv) and isinstance(expr.a, tirx.Var) and isinstance(expr.b, tirx.IntImm):
        found.append((expr.a, int(expr.b.value)))
    for operand in (getattr(expr, "a", None), getattr(expr, "b", None)):
        if isinstance(operand, tvm.ir.expr.Expr):
            _group_divisors(operand, found)
    return found


def split_groups(sch: s_tir.Schedule, main: SBlockRV) -> None:
    """For a grouped convolution, make the conv block iterate (group, channel in group)
    instead of the output channel; nothing when the block reads no ``f // F_g`` index.
    ``detect_gemm`` and ``reindex`` then see ``(g * F_g + f) // F_g`` as ``g``."""
    stmt = sch.get(main)
    found = [d for region in stmt.reads for rng in region.region for d in _group_divisors(rng.min, [])]
    spatial = {iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.DataPar}
    found = [(v, d) for v, d in found if any(v.same_as(s) for s in spatial)]
    if len(found) != 1:
        return
    var, divisor = found[0]
    inputs = [tirx.Var(f"i{k}", str(iv.var.ty)) for k, iv in enumerate(stmt.iter_vars)]
    outputs = []
    for iv, i in zip(stmt.iter_vars, inputs):
        if iv.var.same_as(var):
            outputs += [tirx.floordiv(i, divisor), tirx.floormod(i, divisor)]
        else:
            outputs.append(i)
    sch.transform_block_layout(main, tirx.IndexMap(inputs, outputs, None))


def channel_role(block: s_tir.SBlock) -> IterRole:
    """The GEMM role (I or J) of the output channels: that of the operand read plainly."""
    input_first = any(
        not isinstance(rng.min, (tirx.Var, tirx.IntImm)) for rng in block.reads[0].region
    )
    return IterRole.J if input_first else IterRole.I


class Conv2d(CPUScheduleRule):
    """Default CPU schedule for a (fused) NCHW conv2d PrimFunc; None when not one.

    ``vector_axis``: ``"positions"`` (default: the output's y*W + x) or ``"channels"``.
    ``tunable=True`` returns the GEMM kernel's tuning design spaces (``gemm.gemm_spaces``);
    the GEMM plan's knobs come from ``options`` (the default ones when None).
    """

    def __init__(self, vector_axis: str = "positions", options: CompileOptions | None = None) -> None:
        if vector_axis not in ("channels", "positions"):
            raise ValueError(f"Conv2d(vector_axis={vector_axis!r}): use 'positions' or 'channels'")
        self.vector_axis = vector_axis
        self.options = options

    def apply(self, func: tirx.PrimFunc, target: Target,
              tunable: bool) -> s_tir.Schedule | list[s_tir.Schedule] | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        try:
            sch = s_tir.Schedule(func)
            main = find_reduction_block(sch)
            if main is None or not looks_like_convolution(sch.get(main)):
                return None
            split_groups(sch, main)
        except Exception:  # noqa: BLE001 - ScheduleError: the block layout cannot change
            return None
        main = find_reduction_block(sch)
        if main is None:
            return None
        traits = detect_gemm(sch.get(main))
        if traits is None:
            return None
        channels = channel_role(sch.get(main))
        positions = IterRole.I if channels == IterRole.J else IterRole.J
        # Vectorising positions beats channels on every ResNet-50/SqueezeNet layer, 7x7 maps
        # included: the weight is then read in place and the epilogue writes NCHW rows
        # without a transpose.
        if self.vector_axis == "channels" and channels in traits.block:
            role = channels
        elif positions in traits.block:
            role = positions
        else:
            role = channels
        try:
            if tunable:
                return gemm_spaces(sch, main, traits, role, target, self.options) or None
            schedule_gemm(sch, main, traits, role, target, options=self.options)
        except Exception:  # noqa: BLE001  # ScheduleError / InternalError: not our shape
            return None
        return sch
