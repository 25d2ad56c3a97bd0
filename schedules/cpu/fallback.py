"""CPU fallback rule: parallelize what TensorIR proves parallel, change nothing else.

It accepts any PrimFunc, including ones ``NormalizePrimFunc`` rejects (opaque blocks,
hand-written loops, extern calls).  For each block directly under the root it marks the
outermost loop parallel when every block beneath that loop binds the loop only to
data-parallel iterators.  ``Schedule.parallel`` re-checks the same condition (complete or
reduction blocks, affine bindings) and refuses otherwise, so the rule cannot create a race:
a refused loop is simply left serial.  It is the last CPU rule, after Gemm, Conv2d,
Reduction and Elementwise.
"""

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.s_tir.schedule import LoopRV, SBlockRV
from tvm.target import Target

from .common import MIN_PARALLEL_WORK, loop_kinds, nest_work, try_parallel


def _is_zero(extent: tirx.Expr) -> bool:
    return isinstance(extent, tirx.IntImm) and extent.value == 0


def leading_spatial_nest(sch: s_tir.Schedule, block: SBlockRV) -> list[LoopRV]:
    """The outer loops of ``block`` that bind only spatial iterators and nest perfectly."""
    nest: list[LoopRV] = []
    for loop, kind in zip(sch.get_loops(block), loop_kinds(sch, block)):
        if kind != "S" or sch.get(loop).kind != tirx.ForKind.SERIAL:
            break
        if nest and not sch.get(nest[-1]).body.same_as(sch.get(loop)):
            break
        nest.append(loop)
    return nest


class Fallback(CPUScheduleRule):
    """Fuse the outer spatial loops of every root-level block and parallelize them.

    Accepts every PrimFunc on a CPU target; one it cannot improve comes back unchanged
    (serial), which is still its default schedule.
    """

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        try:
            sch = s_tir.Schedule(func)
        except (s_tir.ScheduleError, ValueError, TypeError):
            return None  # not a TensorIR function (no blocks): nothing to schedule
        try:
            root = get_root_block(sch)
        except ValueError:
            return sch  # the body is not a block
        for block in sch.get_child_blocks(root):
            loops = sch.get_loops(block)
            if not loops or any(_is_zero(sch.get(loop).extent) for loop in loops):
                continue  # no loop, or an empty one (a slice of zero width): nothing to run in parallel
            work = nest_work(sch, loops[0])
            if work is not None and work < MIN_PARALLEL_WORK:
                continue
            nest = leading_spatial_nest(sch, block)
            if len(nest) > 1:
                nest = [sch.fuse(*nest)]
            try_parallel(sch, nest[0] if nest else loops[0])
        return sch
