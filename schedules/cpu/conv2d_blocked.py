"""CPU schedule rule for conv2d in a blocked layout (``NCHW{b}c``): direct convolution,
vectorised over the channel block.

Accepts a static-shape PrimFunc whose single reduction block writes a 5-D
``out[n, o, y, x, j]`` (``j`` the output channel block, at most four vectors wide) as
``relax_passes.legalize_blocked_conv`` computes it: dense (reduction ``(c, r, q, i)``, or
``(c, r, q)`` for a plain NCHW input), grouped (reduction ``(c, r, q, i)`` over the input
blocks of the output block's group) or depthwise (reduction ``(r, q)``), with injective
producers (the padding block) and consumers (bias, activation, residual add). Anything
else gets None.

Dense, per task of ``(n, block of output-channel blocks, output row)`` in parallel::

    for x0 in W / wb:                           # wb output columns x vb channel blocks:
      acc[wb, vb, b] = 0                        # wb * vb accumulators, in registers
      for c, r, q, i:                           # every input channel and tap
        for x in wb (unrolled), v in vb (unrolled):
          acc[x, v, :] += in[n, c, y*s + r, (x0*wb + x)*s + q, i] * w[o*vb + v, c, r, q, i, :]
      out[n, o*vb + v, y, x0*wb + x, :] = epilogue(acc)    # vector stores

one broadcast per ``vb`` FMAs and one weight vector per ``wb`` FMAs (the GEMM
micro-kernel with the output channels as its vector axis and the output columns as its
rows), so the input needs no im2col copy and the output no transpose. The padded input
is one separate parallel pass (a copy of the input, cheap beside a dense convolution).
When the input overflows a core's cache and the weights fit it, a task is instead
``(n, output row)`` running every channel tile in turn (``rows_outermost``): the input
is then read from memory once, not once per channel tile.

Grouped runs the same nest: ``c`` ranges over the group's input blocks, read at
``g*K + c`` (``g = o // (blocks per group)``), and the ``vb`` blocks of a tile are taken
within one group (``vb`` divides the blocks per group) so they share the broadcast.

Depthwise, per channel block and block of output rows (``depthwise.rows_per_task``: a
whole plane when the planes alone make enough tasks, split evenly over the cores): the pad
of the rows a task reads is computed in the task, then ``acc[wb, b] += in[.., y*s + r, x*s + q, :] *
w[o, 0, r, q, 0, :]``: one contiguous vector load per FMA.

Each schedule follows a ``ConvPlan`` (register tile, task order or rows per task);
``apply(..., tunable=True)`` returns one complete schedule per plan near the default
(``dense_plans``, ``depthwise_plans``), the default's first, which tuning measures one by
one (``tune_space.space_count``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import s_tir, tirx
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.s_tir.schedule import LoopRV, SBlockRV
from tvm.target import Target

from aicf_tvm.core.options import CompileOptions, options_or_default

from .common import (
    PARTITION_HINT,
    TASKS_PER_CORE,
    buffer_bytes,
    float32_lanes,
    loop_extent,
    num_cores,
    vector_registers,
)
from .depthwise import rows_per_task
from .gemm_blocks import inline_consumers, schedule_injective, static_reduction_block
from .gemm_prefetch import mark_blocked_sums


# Vector registers a register tile leaves free beside its accumulators and one weight
# vector per channel block, for the input broadcasts: AVX-512 folds the broadcast into
# the FMA ({1to16}), AVX2 needs a register per broadcast in flight.
def _spare_registers(registers: int) -> int:
    return 2 if registers >= 32 else 4


# Widest register block over output columns.
_MAX_COLUMNS = 14
# A core's share of the cache the input and weights of a task are re-read from (L2).
_CACHE_BYTES = 1 << 20


def blocked_conv_block(sch: s_tir.Schedule) -> tuple[SBlockRV, bool] | None:
    """(conv block, is depthwise) when the PrimFunc is a blocked conv2d, else None."""
    found = static_reduction_block(sch)
    if found is None or found[1] not in ("SSSSSRR", "SSSSSRRR", "SSSSSRRRR"):
        return None
    main, kinds = found
    stmt = sch.get(main)
    if len(stmt.reads) != 2 or len(stmt.writes) != 1 or len(stmt.writes[0].region) != 5:
        return None
    out = stmt.writes[0].region
    if not all(isinstance(r.min, tirx.Var) for r in out):
        return None
    return main, kinds == "SSSSSRR"


def _largest_divisor(total: int, limit: int) -> int:
    return max(d for d in range(1, min(total, limit) + 1) if total % d == 0)


def blocks_per_group(sch: s_tir.Schedule, main: SBlockRV) -> int:
    """Output channel blocks per group of a dense or grouped conv block: its output blocks
    divided by the groups, the data's channel blocks over the blocks one output reduces."""
    stmt = sch.get(main)
    out_blocks = int(stmt.iter_vars[1].dom.extent)
    data = [r.source for r in stmt.reads if len(r.region) == 5]
    if len(data) != 1:  # plain NCHW data: one group
        return out_blocks
    groups = int(data[0].shape[1]) // int(stmt.iter_vars[5].dom.extent)
    return out_blocks // max(groups, 1)


def _widest_columns(width: int, vectors: int, registers: int) -> int:
    """The most output columns of a tile of ``vectors`` accumulators per column whose
    accumulators and ``vectors`` weight vectors fit ``registers`` (0: not even one)."""
    return min(_MAX_COLUMNS, width, registers // vectors - 1)


def register_tile(blocks: int, width: int, vectors_per_block: int,
                  registers: int = 32, form: str = "held") -> tuple[int, int]:
    """(channel blocks, output columns) of the register tile, of 1, 2 or 4 channel blocks
    dividing ``blocks``, whose accumulators and one weight vector per block fit beside the
    broadcasts; of those the most FMAs per step, then the fewest loads per FMA.

    With 32 registers (AVX-512) the columns divide the width, unless the best such tile
    holds under half the accumulators of the best whose last tile is partial (run apart,
    ``schedule_dense``): a prime width such as 199 would otherwise take one column per
    step (wav2vec2's feature encoder as conv2ds over a height of 1, widths 1599, 799,
    399 and 199, which the wider tile runs as fast as the im2col GEMM or faster), while
    widths 7 and 49 keep 2 blocks by 7 columns. A tile
    with a partial last tile holds at most half the registers as accumulators (1 x 14,
    not 2 x 14): tuning ResNet-50 at 299 px on Zen 4 chose 1 x 14 over 2 x 14 in
    6 of the 8 tasks of widths 38 and 19, each faster in the model.
    With 16 (AVX2: 12 for the tile) they divide it unless the widest dividing count is
    under half the widest that fits; then the widest runs, its last, partial tile apart.
    On Zen 3, tuning the plans chose 2x4 (widths 56,
    28, 112) or 2x5 (14, 7) over the 4x3 tile that left the weights no registers in 28 of
    the 30 dense ResNet-50 and ConvNeXt tasks (4x2 in the other two), and depthwise 1x8
    (56) and 1x7 (14) over 1x12; both models ran faster end to end with those tiles.
    ``form`` (``CompileOptions.conv_register_tile``) restores an earlier form of the rule:
    ``"dividing"`` (columns always divide the width) or ``"partial"`` (the partial tile of
    the most FMAs, however many accumulators it holds).
    """
    dividing, partial = tile_candidates(blocks, width, vectors_per_block, registers)
    if not dividing:
        return 1, 1
    tile, wide = best_tile(dividing), best_tile(partial)
    if form == "dividing" or not (registers >= 32 and 2 * tile[0] * tile[1] < wide[0] * wide[1]):
        return tile
    if form == "partial":
        return wide
    held = [t for t in partial if t[0] * max(1, vectors_per_block) * t[1] <= registers // 2]
    return best_tile(held) if held else wide


def tile_candidates(blocks: int, width: int, vectors_per_block: int,
                    registers: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Per block count that fits (4, 2, 1), the tile whose columns divide the width (at
    16 registers, unless that halves the widest) and the widest tile (its last partial)."""
    per_block = max(1, vectors_per_block)
    accumulators = registers - _spare_registers(registers)
    dividing, partial = [], []
    for vb in (4, 2, 1):
        vectors = vb * per_block  # weight vectors of the tile, and accumulators per column
        if blocks % vb or 2 * vectors > accumulators:  # one column and the weights must fit
            continue
        widest = _widest_columns(width, vectors, accumulators)
        columns = _largest_divisor(width, widest)
        if registers < 32 and 2 * columns < widest:
            columns = widest
        dividing.append((vb, columns))
        partial.append((vb, widest))
    return dividing, partial


def best_tile(tiles: list[tuple[int, int]]) -> tuple[int, int]:
    """The most FMAs per step, then the fewest loads per FMA, then the most columns."""
    return max(tiles, key=lambda t: (t[0] * t[1], -(t[0] + t[1]) / (t[0] * t[1]), t[1]))


def _split_columns(sch: s_tir.Schedule, x: LoopRV, width: int,
                   columns: int) -> tuple[LoopRV, LoopRV]:
    """``x`` split into (tiles, columns); a last, partial tile is run apart by LoopPartition."""
    xo, xi = sch.split(x, [None, columns])
    if width % columns:
        sch.annotate(xo, PARTITION_HINT, tirx.IntImm("int32", 1))
    return xo, xi


def _place_epilogue(sch: s_tir.Schedule, main: SBlockRV, at: LoopRV) -> None:
    """The fused epilogue (or a cache of the tile when there is none) after the tile's
    reduction, vectorised over the channel block."""
    consumers = inline_consumers(sch, main)
    if len(consumers) > 1:
        raise ValueError("blocked conv2d: the output feeds more than one epilogue block")
    tail = consumers[0] if consumers else sch.cache_write(main, 0, "global")
    sch.set_scope(main, 0, "local")  # a stack tile: LLVM holds it in registers
    sch.reverse_compute_at(tail, at, preserve_unit_loops=True)
    loops = sch.get_loops(tail)
    sch.vectorize(loops[-1])


def rows_outermost(sch: s_tir.Schedule, main: SBlockRV, target: Target) -> bool:
    """Whether the dense tasks go by output row, each running every output-channel tile.

    By (channel tile, row) the input is read once per channel tile and the weights once;
    by row it is the input once and the weights once per row. The second wins when the
    input overflows a core's cache share (re-read from memory per tile: a 1x1 256 -> 512
    at 56x56 reads 3 MB sixteen times) while the weights fit it (re-read from cache),
    and there are rows enough to balance the cores."""
    stmt = sch.get(main)
    weights = [r.source for r in stmt.reads if len(r.region) == 6]
    data = [r.source for r in stmt.reads if len(r.region) != 6]
    if len(weights) != 1 or len(data) != 1:
        return False
    rows = int(stmt.iter_vars[0].dom.extent) * int(stmt.iter_vars[2].dom.extent)
    data_bytes, weight_bytes = buffer_bytes(data[0]), buffer_bytes(weights[0])
    if data_bytes is None or weight_bytes is None:
        return False
    return data_bytes > _CACHE_BYTES >= weight_bytes and rows >= TASKS_PER_CORE * num_cores(target)


@dataclass(frozen=True)
class ConvPlan:
    """The choices of a blocked conv2d schedule: the register tile (``channel_blocks`` x
    ``columns``; depthwise tiles one block), and how tasks split the work (dense:
    ``by_rows``, ``rows_outermost``; depthwise: ``rows`` output rows per task)."""

    channel_blocks: int
    columns: int
    by_rows: bool = False
    rows: int = 0

    def label(self) -> str:
        order = f"rows={self.rows}" if self.rows else ("by row" if self.by_rows else "by channel tile")
        return f"{self.channel_blocks}x{self.columns} tile, {order}"


# Structural neighbours of the default plan a tuning run measures, at most.
MAX_PLANS = 12


def _column_choices(channel_blocks: int, width: int, per_block: int, registers: int) -> set[int]:
    """Column counts of a tile of ``channel_blocks`` whose accumulators and one weight
    vector per block fit ``registers``: those dividing ``width``, and the widest."""
    widest = _widest_columns(width, channel_blocks * per_block, registers)
    return {d for d in range(1, widest + 1) if width % d == 0} | ({widest} if widest >= 1 else set())


def _tile_shape(stmt: s_tir.SBlock, target: Target) -> tuple[int, int, int]:
    """(output width, vectors per channel block, registers a tile may hold) of a conv block."""
    per_block = -(-int(stmt.iter_vars[4].dom.extent) // float32_lanes(target))
    registers = vector_registers(target)
    return int(stmt.iter_vars[3].dom.extent), per_block, registers - _spare_registers(registers)


def _nearest_first(default: ConvPlan, plans: list[ConvPlan]) -> list[ConvPlan]:
    """``default``, then the other plans in ``plans`` (distinct) by how far they move from it."""
    def distance(p: ConvPlan) -> tuple:
        return (abs(math.log2(p.channel_blocks / default.channel_blocks)) + abs(math.log2(p.columns / default.columns))
                + (p.by_rows != default.by_rows) + (p.rows != default.rows), p.channel_blocks, p.columns, p.rows)
    rest = sorted({p for p in plans if p != default}, key=distance)
    return [default, *rest][:MAX_PLANS]


def dense_plan(sch: s_tir.Schedule, main: SBlockRV, target: Target,
               options: CompileOptions | None = None) -> ConvPlan:
    """The default plan of a dense or grouped conv block: ``register_tile`` over the
    blocks of one group (of the form ``options`` names), tasks by ``rows_outermost``."""
    width, per_block, _ = _tile_shape(sch.get(main), target)
    vb, wb = register_tile(blocks_per_group(sch, main), width, per_block, vector_registers(target),
                           options_or_default(options).conv_register_tile)
    return ConvPlan(vb, wb, rows_outermost(sch, main, target))


def dense_plans(sch: s_tir.Schedule, main: SBlockRV, target: Target,
                options: CompileOptions | None = None) -> list[ConvPlan]:
    """The default plan and its neighbours: every tile of 1, 2 or 4 blocks (dividing the
    group's) by a column count that divides the width or is the widest the registers hold,
    whose accumulators and weights fit beside the broadcasts, in either task order."""
    default = dense_plan(sch, main, target, options)
    width, per_block, registers = _tile_shape(sch.get(main), target)
    blocks = blocks_per_group(sch, main)
    plans = []
    for vb in (1, 2, 4):
        if blocks % vb:
            continue
        for wb in _column_choices(vb, width, per_block, registers):
            plans += [ConvPlan(vb, wb, default.by_rows), ConvPlan(vb, wb, not default.by_rows)]
    return _nearest_first(default, plans)


def schedule_dense(sch: s_tir.Schedule, main: SBlockRV, target: Target, plan: ConvPlan | None = None,
                   options: CompileOptions | None = None) -> None:
    plan = plan or dense_plan(sch, main, target, options)
    lanes = float32_lanes(target)
    for producer in sch.get_producers(main):
        schedule_injective(sch, producer, lanes)
    n, o, y, x, j, *reduction = sch.get_loops(main)
    oo, oi = sch.split(o, [None, plan.channel_blocks])
    xo, xi = _split_columns(sch, x, loop_extent(sch, x), plan.columns)
    by_rows = plan.by_rows
    sch.reorder(n, *((y, oo) if by_rows else (oo, y)), xo, *reduction, xi, oi, j)
    _place_epilogue(sch, main, xo)
    sch.parallel(sch.fuse(n, y) if by_rows else sch.fuse(n, oo, y))
    sch.unroll(xi)
    sch.unroll(oi)
    sch.vectorize(j)
    blocked = _sum_blocks(sch, reduction) if options_or_default(options).blocked_sums else None
    init = sch.decompose_reduction(main, reduction[0])
    sch.vectorize(sch.get_loops(init)[-1])
    if blocked is not None:  # each block of input channels summed from zero, then added
        mark_blocked_sums(sch, blocked, sch.get(main).writes[0].source.dtype)


# terms a block of a convolution's sum adds from zero (about a GEMM's kc): fewer, and the
# tile's zeroing and adding back costs (1 x 1 convolutions of 8-channel blocks: 7-14% slower)
SUM_BLOCK_TERMS = 256


def _sum_blocks(sch: s_tir.Schedule, reduction: list[LoopRV]) -> LoopRV | None:
    """The loop to mark for blocked sums (``gemm_prefetch.K_SUMS``): the channel-block loop
    ``reduction[0]`` split so that a block covers about ``SUM_BLOCK_TERMS`` terms (its
    inner part, or ``reduction[1]`` when one channel block is as many); None when the
    whole sum is one block (nothing to gain) or an extent is symbolic."""
    extents = [loop_extent(sch, loop) for loop in reduction]
    if len(reduction) < 2 or any(e is None for e in extents):
        return None
    per_channel = math.prod(extents[1:])
    channels = extents[0]
    inner = _largest_divisor(channels, max(1, -(-SUM_BLOCK_TERMS // per_channel)))
    if inner >= channels:
        return None
    if inner == 1:
        return reduction[1]
    outer, block = sch.split(reduction[0], [None, inner])
    reduction[0] = outer
    return block


def depthwise_plan(sch: s_tir.Schedule, main: SBlockRV, target: Target,
                   options: CompileOptions | None = None) -> ConvPlan:
    """The default plan of a depthwise conv block: the widest column tile of one block,
    ``rows_per_task`` rows per task."""
    stmt = sch.get(main)
    width, per_block, _ = _tile_shape(stmt, target)
    _, wb = register_tile(1, width, per_block, vector_registers(target),
                          options_or_default(options).conv_register_tile)
    planes = int(stmt.iter_vars[0].dom.extent) * int(stmt.iter_vars[1].dom.extent)
    return ConvPlan(1, wb, rows=rows_per_task(planes, int(stmt.iter_vars[2].dom.extent), num_cores(target)))


def depthwise_plans(sch: s_tir.Schedule, main: SBlockRV, target: Target,
                    options: CompileOptions | None = None) -> list[ConvPlan]:
    """The default plan and its neighbours: column tiles that divide the width (or the
    widest), by the default rows per task, a whole plane or the default's half or double."""
    default = depthwise_plan(sch, main, target, options)
    stmt = sch.get(main)
    width, per_block, registers = _tile_shape(stmt, target)
    height = int(stmt.iter_vars[2].dom.extent)
    rows = {r for r in (default.rows, default.rows // 2, default.rows * 2, height)
            if 1 <= r <= height and height % r == 0}
    plans = [ConvPlan(1, wb, rows=default.rows) for wb in _column_choices(1, width, per_block, registers)]
    plans += [ConvPlan(1, default.columns, rows=r) for r in rows]
    return _nearest_first(default, plans)


def schedule_depthwise(sch: s_tir.Schedule, main: SBlockRV, target: Target, plan: ConvPlan | None = None,
                       options: CompileOptions | None = None) -> None:
    plan = plan or depthwise_plan(sch, main, target, options)
    producers = sch.get_producers(main)
    n, o, y, x, j, r, q = sch.get_loops(main)
    xo, xi = _split_columns(sch, x, loop_extent(sch, x), plan.columns)
    yo, yi = sch.split(y, [None, plan.rows])
    sch.reorder(n, o, yo, yi, xo, r, q, xi, j)
    _place_epilogue(sch, main, xo)
    task = sch.fuse(n, o, yo)
    for producer in producers:
        sch.compute_at(producer, task, preserve_unit_loops=True)
        sch.vectorize(sch.get_loops(producer)[-1])
    sch.parallel(task)
    sch.unroll(xi)
    sch.unroll(r)
    sch.unroll(q)
    sch.vectorize(j)
    init = sch.decompose_reduction(main, r)
    sch.vectorize(sch.get_loops(init)[-1])


class BlockedConv2d(CPUScheduleRule):
    """Direct schedule for a (fused) blocked-layout conv2d PrimFunc; None when not one.

    ``tunable=True`` returns the tuning design spaces instead: one complete schedule per
    plan of ``dense_plans`` / ``depthwise_plans``, the default plan's first (nothing is
    sampled: tuning measures each, ``tune_space``); the register tile's form comes from
    ``options`` (the default ones when None)."""

    def __init__(self, options: CompileOptions | None = None) -> None:
        self.options = options

    def apply(self, func: tirx.PrimFunc, target: Target,
              tunable: bool) -> s_tir.Schedule | list[s_tir.Schedule] | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        try:
            sch = s_tir.Schedule(func)
            found = blocked_conv_block(sch)
            if found is None:
                return None
            main, depthwise = found
            schedule = schedule_depthwise if depthwise else schedule_dense
            if not tunable:
                schedule(sch, main, target, options=self.options)
                return sch
            plans = (depthwise_plans if depthwise else dense_plans)(sch, main, target, self.options)
        except (RuntimeError, ValueError):  # ScheduleError / InternalError: not our shape
            return None
        spaces = []
        for plan in plans:
            space = sch.copy()
            try:
                schedule(space, main, target, plan)
            except (RuntimeError, ValueError):  # this plan does not fit the block
                continue
            spaces.append(space)
        return spaces or None
