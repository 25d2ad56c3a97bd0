"""CPU depthwise conv2d schedule rule: direct convolution, vectorised along output rows.

im2col turns a depthwise convolution into one tiny GEMM per channel (``1 x k*k`` by
``k*k x H*W``): the copy costs as much as the arithmetic and the weight row is too short
to block. This rule computes it directly instead. Accepts a static-shape NCHW PrimFunc
whose single reduction block is a convolution (TOPI's ``group_conv2d_nchw``) reading one
input channel per output channel (reduction iters ``(rc, ry, rx)`` with ``rc`` of extent
1: groups == channels, any channel multiplier), any kernel size, stride, dilation and
padding, with injective producers (the padding block) and consumers (bias, ReLU/ReLU6,
residual add). Anything else gets None, so ``Conv2d`` (im2col + GEMM) takes it.

The loop nest, per (batch, channel, block of ``rows`` output rows) in parallel::

    [padding of the rows this block reads, when the pad is in the kernel]
    for y in rows:                       # the accumulators: one output row, in registers
        acc[0:W] = 0                     # vectorised over the whole output width
        for r, q in k x k (unrolled):
            acc[0:W] += in[y*s + r*d, q*d : q*d + W*s : s] * w[c, r, q]   # one broadcast
        out[y, 0:W] = epilogue(acc)      # bias/activation/residual, vectorised

For a width stride s > 1 the input rows a task reads are first copied as
``[row, x % s, x // s]`` (``deinterleave_input``), so the taps load contiguous vectors;
when that copy cannot be laid out the rule schedules the plain strided reads instead.
The output width W is one vector expression (LLVM splits it into registers: 112 floats
are 7 AVX-512 registers), so no tail loop or predicate is needed for odd widths.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.s_tir.schedule import SBlockRV
from tvm.sym.pattern import detect_linear_equation
from tvm.target import Target

from .common import TASKS_PER_CORE, float32_lanes, loop_extent, num_cores, vector_registers
from .gemm_blocks import inline_consumers, static_reduction_block

# Widest output row kept as one vector expression (8 AVX-512 vectors); wider rows take the
# im2col rule.  The row's vectors and a broadcast weight must also fit the registers: 14
# AVX2 vectors (112 floats) of its 16.
_MAX_ROW_FLOATS = 128


def depthwise_block(sch: s_tir.Schedule) -> SBlockRV | None:
    """The conv block when the PrimFunc is an NCHW depthwise convolution, else None."""
    found = static_reduction_block(sch)
    if found is None or found[1] != "SSSSRRR":
        return None
    main = found[0]
    stmt = sch.get(main)
    if int(stmt.iter_vars[4].dom.extent) != 1:  # more than one input channel per output
        return None
    if len(stmt.reads) != 2 or len(stmt.writes) != 1 or len(stmt.writes[0].region) != 4:
        return None
    # the input is read at (n, channel-expr, y*s + r*d, x*s + q*d): compound spatial indices
    data = [r for r in stmt.reads if len(r.region) == 4 and not isinstance(r.region[3].min, tirx.Var)]
    if len(data) != 1:
        return None
    return main


def rows_per_task(planes: int, height: int, cores: int) -> int:
    """Output rows per parallel task: the largest divisor of ``height`` that gives every
    core enough tasks (``TASKS_PER_CORE``) and the same number of them (TVM splits a
    parallel loop statically: 9 planes on 2 cores run 5 against 4); a whole channel plane
    when the planes alone do. Each task pads only the rows it reads, so fewer, taller
    tasks copy fewer rows twice."""
    for rows in range(height, 0, -1):
        tasks = planes * (height // rows)
        if height % rows == 0 and tasks >= TASKS_PER_CORE * cores and tasks % cores == 0:
            return rows
    return 1


def width_stride(sch: s_tir.Schedule, main: SBlockRV) -> int:
    """The stride s of the input's width index ``x*s + q*d`` (1 when it is not linear)."""
    stmt = sch.get(main)
    x = stmt.iter_vars[3].var
    for region in stmt.reads:
        if len(region.region) == 4 and not isinstance(region.region[3].min, tirx.Var):
            coeffs = detect_linear_equation(region.region[3].min, [x])
            if len(coeffs) == 2 and isinstance(coeffs[0], tirx.IntImm):
                return int(coeffs[0].value)
    return 1


def deinterleave_input(sch: s_tir.Schedule, main: SBlockRV, stride: int) -> SBlockRV:
    """Copy the input into ``[.., row, x % s, x // s]``: a strided vector load is s
    scalar loads per lane in LLVM's codegen, a row of this copy is one contiguous load."""
    stmt = sch.get(main)
    index = next(i for i, r in enumerate(stmt.reads) if not isinstance(r.region[3].min, tirx.Var))
    copy = sch.cache_read(main, index, "global")
    sch.transform_layout(
        copy, ("write", 0), lambda n, c, h, w: (n, c, h, w % stride, w // stride), pad_value=0.0
    )
    return copy


def schedule_depthwise(sch: s_tir.Schedule, main: SBlockRV, target: Target, deinterleave: bool) -> None:
    """Apply the direct schedule of the module docstring to ``main`` (raises if it cannot);
    ``deinterleave``: read a strided input through ``deinterleave_input``."""
    lanes = float32_lanes(target)
    stride = width_stride(sch, main)
    if deinterleave and stride == 1:
        raise ValueError("depthwise: a stride-1 input needs no deinterleaving")
    if deinterleave:
        copy = deinterleave_input(sch, main, stride)
        producers = [copy, *sch.get_producers(copy)]  # consumers before their producers
    else:
        producers = sch.get_producers(main)
    consumers = inline_consumers(sch, main)
    if len(consumers) > 1:
        raise ValueError("depthwise: the output feeds more than one epilogue block")
    n, c, y, x, rc, ry, rx = sch.get_loops(main)
    height, width = loop_extent(sch, y), loop_extent(sch, x)
    if width > min(_MAX_ROW_FLOATS, (vector_registers(target) - 2) * lanes):
        raise ValueError(f"depthwise: output width {width} is wider than one row of registers")
    planes = loop_extent(sch, n) * loop_extent(sch, c)
    rows = rows_per_task(planes, height, num_cores(target))
    yo, yi = sch.split(y, [None, rows])
    sch.reorder(n, c, yo, yi, rc, ry, rx, x)
    for producer in producers:
        sch.compute_at(producer, yo, preserve_unit_loops=True)
    if consumers:
        sch.reverse_compute_at(consumers[0], yi, preserve_unit_loops=True)
        sch.vectorize(sch.get_loops(consumers[0])[-1])
    # parallel/vectorize check the update is a reduction block: before decompose_reduction
    sch.parallel(sch.fuse(n, c, yo))
    sch.vectorize(x)
    sch.unroll(ry)
    sch.unroll(rx)
    init = sch.decompose_reduction(main, rc)
    sch.vectorize(sch.get_loops(init)[-1])


class Depthwise(CPUScheduleRule):
    """Direct schedule for a (fused) NCHW depthwise conv2d PrimFunc; None when not one."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        for deinterleave in (True, False):
            sch = s_tir.Schedule(func)
            try:
                main = depthwise_block(sch)
                if main is None:
                    return None
                schedule_depthwise(sch, main, target, deinterleave)
            except (RuntimeError, ValueError):  # ScheduleError / InternalError: not our shape
                continue
            return sch
        return None
