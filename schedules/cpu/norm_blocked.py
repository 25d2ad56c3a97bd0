"""CPU rule for normalizations over the channels of a blocked tensor (``NCHW{b}c``).

A LayerNorm over the channels of ``[N, C/b, H, W, b]`` reduces axes 1 and 4: its
statistics are per ``(n, h, w)``, but the normalized output iterates ``(n, c, h, w, j)``,
so the rows of ``Reduction`` (the leading spatial loops every block shares) do not line
up and the function fell to ``Fallback`` (scalar, one flat loop). This rule:

1. permutes each 5-D spatial block's iterations to ``(n, h, w, c, j)``
   (``transform_block_layout``, a bijection of the same points);
2. splits each reduction at ``j`` (``rfactor``): ``partial[n, h, w, j] = sum(c)
   x[n, c, h, w, j]`` is a vector sum over contiguous blocks, then the ``b`` lanes are
   summed (the same terms, grouped per lane first);
3. runs one task per row ``(n, h)`` in parallel, every statistic computed in it
   (``compute_at``), the output vectorised over ``j``.

None when the function has no such reduction or a step does not apply.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.analysis.common_analysis import get_sblockrealize
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.s_tir.schedule import LoopRV, SBlockRV
from tvm.target import Target

from .gemm_blocks import inline_consumers


def _reduces_blocked_channels(block: s_tir.SBlock) -> bool:
    """A reduction block reading a 5-D buffer at reduction iters on axes 1 and 4 only."""
    reduce = {iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce}
    if not reduce:
        return False
    for region in block.reads:
        if len(region.region) != 5:
            continue
        at = [i for i, rng in enumerate(region.region) if isinstance(rng.min, tirx.Var) and rng.min in reduce]
        if at == [1, 4]:
            return True
    return False


class BlockedNorm(CPUScheduleRule):
    """Reductions over the blocked channels: per-lane partial sums, one row per task."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        try:
            blocks = sch.get_child_blocks(get_root_block(sch))
            reductions = [b for b in blocks if _reduces_blocked_channels(sch.get(b))]
            if not reductions:
                return None
            outputs = [b for b in blocks if _is_5d_spatial(sch.get(b))]
            for block in outputs:
                sch.transform_block_layout(block, lambda n, c, h, w, j: (n, h, w, c, j))
            if not outputs or len(outputs) > 1 + len(inline_consumers(sch, outputs[0])):
                return None
            partials = []
            for block in reductions:  # before compute_at: rfactor wants the block's own nest
                *_, lane = sch.get_loops(block)
                partials.append(sch.rfactor(lane, factor_axis=3))
            last = sch.get_child_blocks(get_root_block(sch))[-1]
            n, h, *inner = sch.get_loops(last)
            row = sch.fuse(n, h)
            sch.vectorize(inner[-1])
            for block in reversed(sch.get_child_blocks(get_root_block(sch))[:-1]):
                sch.compute_at(block, row, preserve_unit_loops=True)
            sch.parallel(row)  # before decompose_reduction: it checks the reduction blocks
            for partial in partials:
                lanes, over = _lane_and_reduction_loops(sch, partial)
                sch.reorder(over, lanes)
                sch.vectorize(lanes)
                sch.vectorize(sch.get_loops(sch.decompose_reduction(partial, over))[-1])
        except (RuntimeError, ValueError):  # ScheduleError: not the shape this rule expects
            return None
        return sch


def _lane_and_reduction_loops(sch: s_tir.Schedule, partial: SBlockRV) -> tuple[LoopRV, LoopRV]:
    """The loops binding the partial sum's lane (its first iter, from ``rfactor``) and its
    reduction over the channel blocks."""
    values = get_sblockrealize(sch, partial).iter_values
    stmt = sch.get(partial)
    reduce_at = next(i for i, iv in enumerate(stmt.iter_vars) if iv.iter_type == tirx.IterVar.CommReduce)
    found = {}
    for loop in sch.get_loops(partial):
        var = sch.get(loop).loop_var
        for key, index in (("lane", 0), ("over", reduce_at)):
            if values[index].same_as(var):
                found[key] = loop
    if len(found) != 2:
        raise ValueError("blocked norm: the partial sum's loops are not plain")
    return found["lane"], found["over"]


def _is_5d_spatial(block: s_tir.SBlock) -> bool:
    return len(block.iter_vars) == 5 and all(iv.iter_type == tirx.IterVar.DataPar for iv in block.iter_vars)
