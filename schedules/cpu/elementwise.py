"""CPU rule for injective PrimFuncs: elementwise chains, broadcast, transpose, reshape
copies, concat, strided_slice, take, pad.

Accepts a PrimFunc when ``NormalizePrimFunc`` succeeds and every block is spatial only
('S' iterators).  Producers are inlined into consumers (``compute_inline`` /
``reverse_compute_inline``; TensorIR refuses an illegal inline with a ``ScheduleError``,
so what stays is left materialized; any other error ends the rule, since it may leave
the schedule half-rewritten; a block storing an immediate is never inlined across, see
``schedules.constants``).  Each remaining block gets its loops fused into one, split
into a parallel outer loop and a vectorized inner loop of one SIMD register.  The inner loop never crosses
a row of the output unless the row length is a multiple of the vector, so the vector
indices stay affine.  With symbolic extents the loops are not fused into one: the
innermost loop is vectorized (a symbolic one with its tail split off at lowering,
``split_vector_tail``) and the outer loops fused into the parallel loop.  Rejected (None): any
reduction block, a non-LLVM target, or a function TensorIR cannot normalize.
"""

import math

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import SBlockInfo, normalize_prim_func
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.s_tir.schedule import SBlockRV
from tvm.target import Target

from ..constants import inlines_a_constant
from ..inline_growth import inlines_too_much
from .common import (
    MIN_PARALLEL_WORK,
    calls_scalar_math,
    has_partition_hint,
    loop_extent,
    output_lanes,
    try_parallel,
    vectorize_innermost,
)


def schedule_injective_block(sch: s_tir.Schedule, block: SBlockRV, lanes: int) -> None:
    """Fuse the block's loops into a parallel outer loop over a vectorized inner loop."""
    loops = sch.get_loops(block)
    if not loops:
        return
    extents = [loop_extent(sch, loop) for loop in loops]
    work = None if None in extents else math.prod(extents)
    if len(loops) > 1 and work is not None and extents[-1] % lanes == 0:
        # Rows are whole vectors, so vectors of the fused loop never straddle two rows.
        # Not with symbolic extents: the fused index would be split again by div/mod by
        # symbolic values (``seq * 64``) that the simplifier cannot fold back.
        loops = [sch.fuse(*loops)]
    vec = None
    if not calls_scalar_math(sch.get(block)):
        vec = vectorize_innermost(sch, loops[-1], lanes)
    outer = sch.get_loops(block)
    if vec is not None or (len(outer) > 1 and extents[-1] is None):
        # a symbolic innermost loop stays serial and contiguous (LLVM may vectorize it):
        # fused into the parallel loop it would cost a div/mod by ``seq`` per element
        outer = outer[:-1]
    if outer and has_partition_hint(sch, outer[-1]):
        outer = outer[:-1]  # the vectors of a symbolic extent: split at lowering, not fused
    if not outer or (work is not None and work < MIN_PARALLEL_WORK):
        return
    try_parallel(sch, sch.fuse(*outer) if len(outer) > 1 else outer[0])


def inline_blocks(sch: s_tir.Schedule, blocks: list[SBlockInfo]) -> list[SBlockInfo]:
    """Inline what TensorIR allows (producers first, then consumers); the blocks left.

    dlight's ``try_inline``, except that a block storing an immediate is never inlined
    across, and only a refusal (``ScheduleError``, schedule unchanged) moves on to the
    next block: dlight catches everything, and a primitive that raised anything else may
    have left the schedule half-rewritten, after which the next primitive can abort the
    process.
    """

    def first_inlined(reverse: bool) -> int | None:
        primitive = sch.reverse_compute_inline if reverse else sch.compute_inline
        for i, info in enumerate(blocks):
            if inlines_a_constant(sch, info.block_rv, reverse):
                continue  # TVM would fold the immediate (schedules.constants)
            if inlines_too_much(sch, info.block_rv, reverse):
                continue  # copies of copies (schedules.inline_growth)
            try:
                primitive(info.block_rv)
            except s_tir.ScheduleError:
                continue
            return i
        return None

    while (i := first_inlined(False)) is not None or (i := first_inlined(True)) is not None:
        blocks.pop(i)
    return blocks


class Elementwise(CPUScheduleRule):
    """Inline, fuse, parallelize and vectorize PrimFuncs made only of spatial blocks."""

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        try:
            sch = s_tir.Schedule(func)
            infos = normalize_prim_func(sch)
            if infos is None or not infos or not all(info.is_injective() for info in infos):
                return None
            # A reduction whose reduce loops all have extent 1 looks injective to dlight, but
            # inlining a block with an init aborts the process inside TVM: not ours to schedule.
            if any(bool(info.is_reduction()) for info in infos):
                return None
            for info in inline_blocks(sch, infos):
                schedule_injective_block(sch, info.block_rv, output_lanes(target, sch, info.block_rv))
        except Exception:  # noqa: BLE001 - ScheduleError / InternalError: leave it to the fallback
            return None
        return sch
