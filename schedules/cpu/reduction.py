"""CPU rule for PrimFuncs with reductions: softmax, layer/RMS norm, pooling, mean/sum,
and multi-block fused kernels such as attention (matmul, scale, mask, softmax, matmul).

Accepts a PrimFunc that ``NormalizePrimFunc`` handles, that has at least one reduction
block, and whose blocks (after inlining) all start with ``n >= 1`` spatial loops: the
"rows" (batch, head, query row...).  Schedule:

1. Inline producers that are cheap (a copy or cast) or have a single consumer; TensorIR
   refuses an illegal inline, so what stays is materialized per row.
2. Fuse the first ``n`` loops of the last block (and of every other output block) into a
   row loop and ``compute_at`` each earlier block under it, so a row's intermediates stay
   in cache.  The rule then checks that no block computes more points than its domain
   holds (rows × per-row work ≤ domain).  Since ``compute_at`` covers every point needed,
   equality means the rows write disjoint regions: the row loop can run in parallel
   without races.  Otherwise it retries with fewer row axes, and returns None at zero.
3. Parallelize the row loop.  Injective blocks vectorize their innermost loop.
   Reduction blocks whose innermost spatial loop indexes the last axis of a read (matmul
   by V in attention, pooling windows) move the reduction outside that loop and
   vectorize it; pure horizontal reductions (max/sum of a row) stay serial, because LLVM
   does not reassociate float sums.  A kernel of several blocks with one output (layer
   norm, RMS norm, softmax; a pre-norm layer's residual sum may be a second output, in
   a row loop of its own) takes up to ``ROW_GROUP`` rows per task, the last task partial
   when no divisor of the rows is near it, and a serial row reduction then steps those
   rows together (``interleave_rows``): independent chains, each row added in its own
   order, so the same bits, and the rows' add chains overlap instead of each waiting on
   its own adds' latency (BERT's and ViT's layer norms ran several times faster). A vector
   reduction with one vector a row (the partial sums of ``relax_passes.legalize_norms``)
   steps the task's rows together the same way.

Every step goes through TensorIR's checked primitives, so a schedule this rule returns
computes what the PrimFunc computes.  Returns None for all-spatial PrimFuncs (see
Elementwise) and for non-LLVM targets.
"""

from tvm import ir, s_tir, sym, tirx
from tvm.s_tir.dlight.analysis import get_root_block, normalize_prim_func
from tvm.s_tir.dlight.analysis.common_analysis import get_sblockrealize
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.s_tir.schedule import LoopRV, SBlockRV
from tvm.target import Target

from ..constants import inlines_a_constant
from .common import (
    MIN_PARALLEL_WORK,
    MIN_VECTOR_EXTENT,
    TASKS_PER_CORE,
    bound_iters,
    calls_scalar_math,
    is_one,
    largest_pow2_divisor,
    loop_extent,
    loop_kinds,
    nest_work,
    num_cores,
    output_lanes,
    split_vector_tail,
    try_parallel,
    vectorize_innermost,
)

_IF_THEN_ELSE = ir.Op.get("prim.if_then_else")


def is_cheap_copy(block: s_tir.SBlock) -> bool:
    """Whether the block only copies, casts or pads one element (free to recompute)."""
    body = block.body
    if not isinstance(body, tirx.BufferStore):
        return False
    return _is_load(body.value)


def _is_load(value: tirx.Expr) -> bool:
    if isinstance(value, tirx.Cast):
        return _is_load(value.value)
    if isinstance(value, ir.Call) and value.op.same_as(_IF_THEN_ELSE):
        return _is_load(value.args[1]) and isinstance(value.args[2], (tirx.IntImm, tirx.FloatImm))
    return isinstance(value, ir.TensorLoad)


def domain_size(block: s_tir.SBlock) -> tirx.Expr:
    """Points in the block's iteration domain."""
    size = tirx.const(1, "int64")
    for iv in block.iter_vars:
        size = size * tirx.Cast("int64", iv.dom.extent)
    return size


def reads_each_input_once(sch: s_tir.Schedule, producer: SBlockRV, consumer: SBlockRV) -> bool:
    """Whether ``consumer`` iterates no more points than ``producer`` writes, so inlining
    the producer does not recompute it (x*x into a sum: yes; p into p@v: no)."""
    return sym.Analyzer().can_prove(
        domain_size(sch.get(consumer)) <= domain_size(sch.get(producer))
    )


def _last_index_var(region) -> tirx.Var | None:
    index = region.region[-1].min if region.region else None
    return index if isinstance(index, tirx.Var) else None


def _is_scaled_load(value: tirx.Expr) -> bool:
    """A load, or a load times/over/plus/minus an immediate (the scaled kᵀ of attention)."""
    if isinstance(value, (tirx.Mul, tirx.Div, tirx.Add, tirx.Sub)):
        imm = (tirx.IntImm, tirx.FloatImm)
        return (_is_load(value.a) and isinstance(value.b, imm)) or (_is_load(value.b) and isinstance(value.a, imm))
    return _is_load(value)


def feeds_a_vector_reduction(sch: s_tir.Schedule, block: SBlockRV) -> bool:
    """Whether ``block`` is a copy (possibly scaled by an immediate) that moves its
    source's last axis (a transpose, e.g. the kᵀ of attention) into a buffer whose single
    consumer, a reduction, reads it with a spatial iter on the last axis.  Materialized,
    that operand gives the reduction a contiguous axis to vectorize; inlined, the
    reduction would read the source with its reduction iter innermost (a serial dot
    product per output)."""
    stmt = sch.get(block)
    consumers = sch.get_consumers(block)
    body = stmt.body
    if not isinstance(body, tirx.BufferStore) or not _is_scaled_load(body.value):
        return False
    if len(consumers) != 1 or len(stmt.reads) != 1 or not stmt.reads[0].region:
        return False
    written = _last_index_var(stmt.writes[0])
    read = tirx.analysis.undefined_vars(stmt.reads[0].region[-1].min)
    if written is None or any(written.same_as(v) for v in read):
        return False
    consumer = sch.get(consumers[0])
    spatial = {iv.var for iv in consumer.iter_vars if iv.iter_type == tirx.IterVar.DataPar}
    if len(spatial) == len(consumer.iter_vars):
        return False  # not a reduction
    buffer = stmt.writes[0].source
    for region in consumer.reads:
        if region.source.same_as(buffer):
            last = _last_index_var(region)
            return last is not None and any(last.same_as(v) for v in spatial)
    return False


def inline_cheap_producers(sch: s_tir.Schedule) -> None:
    """Inline spatial blocks that are cheap copies, or whose single consumer reads each
    of their points once, until none is left; a transposing copy that feeds a reduction
    its vector axis stays (``feeds_a_vector_reduction``)."""
    changed = True
    while changed:
        changed = False
        for info in normalize_prim_func(sch) or []:
            if not info.is_injective() or feeds_a_vector_reduction(sch, info.block_rv) \
                    or inlines_a_constant(sch, info.block_rv, reverse=False):
                continue
            consumers = sch.get_consumers(info.block_rv)
            if not is_cheap_copy(sch.get(info.block_rv)) and not (
                len(consumers) == 1 and reads_each_input_once(sch, info.block_rv, consumers[0])
            ):
                continue
            try:
                sch.compute_inline(info.block_rv)
            except s_tir.ScheduleError:
                continue
            changed = True
            break


def leading_spatial(kinds: str) -> int:
    """Number of leading 'S' letters (dlight's ``cpu.reduction._get_num_leading_s``,
    private there)."""
    return len(kinds) - len(kinds.lstrip("S"))


def is_output_block(sch: s_tir.Schedule, block: SBlockRV) -> bool:
    """Whether the block writes a buffer the function does not allocate (a parameter)."""
    local = sch.get(get_root_block(sch)).alloc_buffers
    return any(
        not any(region.source.same_as(buf) for buf in local) for region in sch.get(block).writes
    )


def indexes_last_axis(block: s_tir.SBlock, var: tirx.Var) -> bool:
    """Whether ``var`` steps the last index of a buffer the block reads by exactly one
    (contiguous loads; a strided window such as a stride-2 pool gathers, which measured
    slower than the scalar loop)."""
    for region in block.reads:
        if not region.region:
            continue
        coeffs = sym.detect_linear_equation(region.region[-1].min, [var])
        if len(coeffs) == 2 and isinstance(coeffs[0], tirx.IntImm) and coeffs[0].value == 1:
            return True
    return False


def computes_once(sch: s_tir.Schedule, block: SBlockRV, size: tirx.Expr) -> bool:
    """Whether the loops around ``block`` iterate no more than its domain ``size``.

    Under a predicate (the partial last task of a row group: ``task * 8 + row < 197``)
    the points counted are those the predicate lets through, when the block's bindings
    map them one to one (``detect_iter_map``, bijective); otherwise it is not proven.
    """
    loops = [sch.get(loop) for loop in sch.get_loops(block)]
    realize = get_sblockrealize(sch, block)
    if is_one(realize.predicate):
        extents = [loop.extent for loop in loops]
    else:
        dom = {loop.loop_var: ir.Range.from_min_extent(loop.min, loop.extent) for loop in loops}
        mapped = sym.detect_iter_map(list(realize.iter_values), dom, realize.predicate,
                                     check_level="bijective")
        if not mapped.indices:
            return False
        extents = [split.extent for index in mapped.indices for split in index.args]
    work = tirx.const(1, "int64")
    for extent in extents:
        work = work * tirx.Cast("int64", extent)
    return sym.Analyzer().can_prove(work <= size)


def is_contiguous_spatial(sch: s_tir.Schedule, block: SBlockRV, loop: LoopRV) -> bool:
    """Whether ``loop`` is long, is bound to exactly one iterator, and that iterator
    indexes the contiguous axis of a read buffer."""
    extent = loop_extent(sch, loop)
    if extent is not None and extent < MIN_VECTOR_EXTENT:
        return False  # a symbolic extent counts as long (its tail is split off)
    bound = bound_iters(sch, block, loop)
    return len(bound) == 1 and indexes_last_axis(sch.get(block), bound[0].var)


# Vector accumulators a reduction block keeps in flight (e.g. 4 x 16 lanes of q·kᵀ per row):
# one alone waits out the FMA latency on every step of the reduction.
ACCUMULATORS = 4


def schedule_reduction_block(sch: s_tir.Schedule, block: SBlockRV, lanes: int,
                             group: int = 1) -> bool:
    """Vectorize a reduction block's innermost spatial loop under its reduction loops;
    False when it has none to vectorize (a horizontal reduction stays serial).

    With one vector accumulator per row under a task of ``group`` rows (the partial sums
    ``relax_passes.legalize_norms`` gives a norm over 1000: 10 lanes a row), the rows'
    loop goes inside the reduction too, unrolled: ``group`` independent vector chains,
    each row still adding its own elements in its own order (``interleave_rows``)."""
    loops = sch.get_loops(block)[1:]
    kinds = loop_kinds(sch, block)[1:]
    if "O" in kinds or "R" not in kinds:
        return False
    spatial = [loop for loop, kind in zip(loops, kinds) if kind == "S"]
    reduce = [loop for loop, kind in zip(loops, kinds) if kind == "R"]
    if not spatial or not is_contiguous_spatial(sch, block, spatial[-1]):
        return False
    last = spatial[-1]
    extent = loop_extent(sch, last)
    chains: list[LoopRV] = []
    if extent is None:
        outer, last = split_vector_tail(sch, last, lanes)
        spatial = [*spatial[:-1], outer, last]
    elif extent > lanes:
        factor = largest_pow2_divisor(extent, lanes)
        if factor < MIN_VECTOR_EXTENT:
            return False
        outer, last = sch.split(last, factors=[None, factor])
        spatial = [*spatial[:-1], outer, last]
        count = largest_pow2_divisor(extent // factor, ACCUMULATORS)
        if count > 1:  # independent vector accumulators hide the add latency
            outer, inner = sch.split(outer, factors=[None, count])
            spatial, chains = [*spatial[:-2], outer, last], [inner]
    if extent is not None and extent <= lanes and group > 1:
        rows = [loop for loop in spatial[:-1] if loop_extent(sch, loop) != 1]
        if len(rows) == 1 and loop_extent(sch, rows[0]) == group:
            spatial, chains = [loop for loop in spatial if not loop.same_as(rows[0])], rows
    sch.reorder(*spatial[:-1], *reduce, *chains, last)
    # Vectorize before decomposing: the update block without init is no longer a
    # reduction block, and TensorIR would refuse to vectorize it.
    sch.vectorize(last)
    for chain in chains:
        sch.unroll(chain)
    init = sch.decompose_reduction(block, reduce[0])
    init_loop = sch.get_loops(init)[-1]
    if sch.get(init_loop).kind != tirx.ForKind.VECTORIZED:
        vectorize_innermost(sch, init_loop, lanes)
    return True


# Rows a task of a multi-block row kernel (layer norm, softmax) takes together, so that
# its serial row reductions run that many independent chains (``interleave_rows``).
ROW_GROUP = 8


def _row_group(rows: int | None, cores: int) -> int:
    """Rows per task: the largest divisor of ``rows`` up to ROW_GROUP that leaves at least
    ``TASKS_PER_CORE`` tasks per core; without one of at least ``ROW_GROUP / 2`` (ViT's
    197 rows, prime), ROW_GROUP rows with a partial last task (a predicate on its rows) if
    that leaves enough tasks; 1 (no grouping) for a symbolic or short row count."""
    if rows is None:
        return 1
    enough = TASKS_PER_CORE * cores
    fitting = [g for g in range(2, ROW_GROUP + 1) if rows % g == 0 and rows // g >= enough]
    best = max(fitting, default=1)
    if best < ROW_GROUP // 2 and -(-rows // ROW_GROUP) >= enough:
        return ROW_GROUP
    return best


def interleave_rows(sch: s_tir.Schedule, block: SBlockRV, group: int) -> None:
    """A serial row reduction under a task of ``group`` rows, its reduction loops moved
    outside the rows' loop and that loop unrolled: ``group`` independent accumulators, so
    each add no longer waits for the one before it (a 768-wide layer norm ran at the add
    latency).  Every row still adds its elements in the order it did, into its own
    accumulator: the results are the same bits."""
    loops, kinds = sch.get_loops(block)[1:], loop_kinds(sch, block)[1:]  # under the task
    if "O" in kinds:
        return
    rows = [loop for loop, kind in zip(loops, kinds) if kind == "S" and loop_extent(sch, loop) != 1]
    reduce = [loop for loop, kind in zip(loops, kinds) if kind == "R"]
    if not reduce or len(rows) != 1 or loop_extent(sch, rows[0]) != group:
        return
    try:  # each primitive checks itself and changes nothing when it refuses
        sch.reorder(*reduce, rows[0])
        sch.unroll(rows[0])
        sch.decompose_reduction(block, reduce[0])
    except s_tir.ScheduleError:
        pass  # the reduction stays as it was placed: serial, still correct


class Reduction(CPUScheduleRule):
    """Row-wise schedule for PrimFuncs with reductions (see the module docstring)."""

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        try:
            probe = s_tir.Schedule(func)
            infos = normalize_prim_func(probe)
            if not infos or all(info.is_injective() for info in infos):
                return None
            candidates = self._row_candidates(probe)
        except Exception:  # noqa: BLE001 - TensorIR refused the function: not ours
            return None
        for rows in candidates:
            try:
                sch = self._schedule(func, target, rows)
            except Exception:  # noqa: BLE001 - ScheduleError / InternalError: try fewer rows
                continue
            if sch is not None:
                return sch
        return None

    @staticmethod
    def _row_candidates(sch: s_tir.Schedule) -> list[int]:
        """Row-axis counts to try, best first."""
        inline_cheap_producers(sch)
        infos = normalize_prim_func(sch) or []
        kinds = [loop_kinds(sch, info.block_rv) for info in infos]
        if not infos:
            return []
        most = min(leading_spatial(k) for k in kinds)
        candidates = list(range(most, 0, -1))
        anchor = infos[-1]
        if (
            most > 1
            and not anchor.is_injective()
            and leading_spatial(kinds[-1]) == most
            and is_contiguous_spatial(
                sch, anchor.block_rv, sch.get_loops(anchor.block_rv)[most - 1]
            )
        ):
            # Leave the contiguous output axis to the vector unit (pooling windows).
            candidates.remove(most - 1)
            candidates.insert(0, most - 1)
        return candidates

    @staticmethod
    def _schedule(func: tirx.PrimFunc, target: Target, rows: int) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        inline_cheap_producers(sch)
        infos = normalize_prim_func(sch)
        if not infos:
            return None
        # transposed operands are computed once, before the rows, not per row
        staged = [info for info in infos if info.is_injective() and feeds_a_vector_reduction(sch, info.block_rv)]
        infos = [info for info in infos if not any(info.block_rv.same_as(t.block_rv) for t in staged)]
        blocks = [info.block_rv for info in infos]
        sizes = [domain_size(sch.get(block)) for block in blocks]
        for info in staged:
            _schedule_staged_copy(sch, info.block_rv, output_lanes(target, sch, info.block_rv))
        anchors: list[LoopRV] = []
        group = 1
        for block in reversed(blocks):
            if not anchors or is_output_block(sch, block):
                loops = sch.get_loops(block)[:rows]
                if len(blocks) == 1:
                    loops = loops[: _enough_rows(sch, loops)]
                anchor = sch.fuse(*loops) if len(loops) > 1 else loops[0]
                # the last block's rows (a norm's output; a second output such as the
                # residual sum a pre-norm layer also returns gets its own row loop)
                if len(blocks) > 1 and not anchors:
                    group = _row_group(loop_extent(sch, anchor), num_cores(target))
                    if group > 1:
                        anchor = sch.split(anchor, [None, group])[0]
                anchors.append(anchor)
            else:
                sch.compute_at(block, anchors[-1], preserve_unit_loops=True)
        if not all(computes_once(sch, b, size) for b, size in zip(blocks, sizes)):
            return None
        if all(loop_extent(sch, anchor) == 1 for anchor in anchors):
            return None  # a single row (e.g. a full reduction to a scalar): nothing to split
        # Parallelize first: once a reduction is decomposed, its update block is neither
        # complete nor a reduction block, and TensorIR refuses parallel loops above it.
        for anchor in anchors:
            work = nest_work(sch, anchor)
            if work is None or work >= MIN_PARALLEL_WORK:
                try_parallel(sch, anchor)
        for info in infos:
            lanes = output_lanes(target, sch, info.block_rv)
            loops = sch.get_loops(info.block_rv)
            if info.is_injective() and len(loops) > 1:
                if not calls_scalar_math(sch.get(info.block_rv)):
                    vectorize_innermost(sch, loops[-1], lanes)
            elif not info.is_injective():
                if not schedule_reduction_block(sch, info.block_rv, lanes, group) and group > 1:
                    interleave_rows(sch, info.block_rv, group)
        return sch


def _schedule_staged_copy(sch: s_tir.Schedule, block: SBlockRV, lanes: int) -> None:
    """A copy left at the root: its outer loops fused and parallel, the last vectorized."""
    loops = sch.get_loops(block)
    if len(loops) > 1:
        vectorize_innermost(sch, loops[-1], lanes)
        loops = sch.get_loops(block)
        outer = [loop for loop in loops if sch.get(loop).kind == tirx.ForKind.SERIAL][:-1] or loops[:1]
        anchor = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        try_parallel(sch, anchor)


# A single-block kernel (pooling, mean) fuses only enough row loops for the threads: every
# fused loop costs a div/mod per iteration, more than a 3x3 max pool's window itself.
MIN_PARALLEL_ROWS = 64


def _enough_rows(sch: s_tir.Schedule, loops: list[LoopRV]) -> int:
    """How many of the leading ``loops`` to fuse to reach MIN_PARALLEL_ROWS iterations."""
    rows = 1
    for count, loop in enumerate(loops, start=1):
        extent = loop_extent(sch, loop)
        if extent is None:
            return count
        rows *= extent
        if rows >= MIN_PARALLEL_ROWS:
            return count
    return len(loops)
