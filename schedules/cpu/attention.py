"""CPU rule for fused attention: softmax(q·kᵀ·scale + mask)·v as two tiled passes.

Accepts a PrimFunc of q·kᵀ, row-wise blocks (scale, mask, softmax, the all-masked-row
guard), p·v and the head merge (``attention_analysis.find_attention``); anything else gets
None, and the generic ``Reduction`` rule takes it.

The schedule (``schedule_attention``; tile sizes from ``plan_attention``), on a function
whose index arithmetic ``StmtSimplify`` has folded under the block domains (the views'
``(j // 197 + i) % 12`` become ``i``, so regions are exact):

1. ``pad_einsum`` pads q·kᵀ to whole tiles (rows to ``rows``, keys to whole vectors) and
   the rows of p·v; padded operands read zero, padded outputs are never read; the
   softmax's row max runs over whole vectors when the key count is symbolic or not a
   multiple of the lanes, repeating real keys, which a max ignores (``whole_vectors.pad_max``);
2. kᵀ is packed once, ``[b, keys / width, k, width]`` (``width`` the keys of a register
   tile), so the keys are the contiguous axis and a tile's keys are one panel (a parallel
   copy of blocks of lanes x head vectors);
3. pass 1, parallel over (b, row tile), a head's row tiles consecutive (``_tile_loop``):
   q·kᵀ of ``rows`` query rows, a register tile of ``rows x key_vectors`` vectors per
   step of the head dimension (for a symbolic key count in a local buffer, copied out per
   tile: ``_accumulate_locally``);
4. pass 2, parallel over the same tiles: the row blocks ``compute_at`` the tile (softmax
   vectorized over the keys, its row reductions interleaved over the tile's rows), then
   p·v, a register tile of ``rows x`` head-dimension vectors per key.  At a constant key
   count of whole register tiles q·kᵀ is computed at the tile too (``_one_pass``): one
   parallel loop, each tile's scores read back from L1 rather than from a buffer of all
   rows (at 512 keys, 1 MiB a head);
5. the head merge, a parallel vectorized copy;
6. at a symbolic key count, each row tile stops at the last key its mask rows leave open,
   when a check per call proves the keys after it add nothing (``masked_keys``: a causal
   prompt's masked half);
7. a tile's nests whose unrolled rows carry the row tail's predicate (the row sums) run
   without it where the whole tile is in range (``unswitch_rows``).

Why it computes what the graph computes: steps 1-5 are TensorIR primitives that check
their preconditions (the rule catches only their ``ScheduleError``), no block is reordered
across another that it depends on, and each dot product and each row sum still
accumulates in float32 in the graph's order (k ascending, keys ascending): tiling and
vectorization change where, not in which order, they add.  The exp of the softmax becomes
``VectorizeMath``'s vector exp (docs/numerics.md).  Only the row max, exact in any order,
is split across lanes.  Steps 6 and 7 rewrite the scheduled function itself; their modules
say why each result keeps its bits (``masked_keys``: a per-call check; ``unswitch_rows``:
the copy runs exactly where the predicates it drops hold).

Primitives left out on purpose, each silently wrong in TVM 0.27: ``reverse_compute_at``
skips consumer points its producers do not cover, and it and ``compute_at`` drop the
predicate of the block they move (so the row max is ``rfactor``-ed over lanes only once its
keys are whole vectors, step 1); ``loop_partition`` of a reduction loop re-runs the init in
every part; ``merge`` checks no dependence.  ``loop_partition`` is
used only on a constant key loop over one block: a spatial row block, or q·kᵀ before its
init is split off (on a loop with several blocks under it, it crashed the process).
"""

from __future__ import annotations

import logging

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.analysis.common_analysis import get_sblockrealize
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.s_tir.schedule import LoopRV, SBlockRV
from tvm.sym.analyzer import Analyzer
from tvm.target import Target

from aicf_tvm.core.numerics import is_relaxed
from aicf_tvm.core.options import CompileOptions, options_or_default

from ..constants import inlines_a_constant
from ..inline_growth import inlines_too_much
from .attention_analysis import (
    AttentionBlocks,
    AttentionPlan,
    count_matmuls,
    find_attention,
    plan_attention,
)
from .common import (
    calls_math,
    float32_lanes,
    is_one,
    note_plan,
    split_vector_tail,
    static_extent,
    vector_registers,
    vectorize_innermost,
)
from .gemm_blocks import schedule_injective
from .masked_keys import skip_masked_keys
from .unswitch_rows import unswitch_unrolled_rows
from .whole_vectors import is_float_max, is_float_sum, pad_max

_LOG = logging.getLogger(__name__)


def _pad_factors(block: s_tir.SBlock, factors: dict[int, int]) -> list[int]:
    """Per block iter, the ``pad_einsum`` factor: 1 where the extent is provably a multiple,
    and for an extent of 1 (its binding is a constant after ``StmtSimplify``, and TVM 0.27's
    ``pad_einsum`` then pads the iter domain but not the loop: it would compute one point)."""
    out = []
    for index, iv in enumerate(block.iter_vars):
        factor = factors.get(index - len(block.iter_vars), 1)
        divides = Analyzer().can_prove(tirx.floormod(iv.dom.extent, factor) == 0)
        out.append(1 if divides or is_one(iv.dom.extent) else factor)
    return out


def _operand_copy(sch: s_tir.Schedule, block: SBlockRV, index: int) -> SBlockRV:
    """The block writing ``block``'s ``index``-th operand; a copy when it is a parameter."""
    source = sch.get(block).reads[index].source
    for producer in sch.get_producers(block):
        if any(w.source.same_as(source) for w in sch.get(producer).writes):
            return producer
    return sch.cache_read(block, index, "global")


def _inline_views(sch: s_tir.Schedule, kept: list[SBlockRV]) -> None:
    """Inline every spatial block except ``kept`` and those computing a math call for more
    than one consumer (the softmax exp: inlined, it would be evaluated twice)."""
    names = {sch.get(b).name_hint for b in kept}
    changed = True
    while changed:
        changed = False
        for block in sch.get_child_blocks(get_root_block(sch)):
            stmt = sch.get(block)
            if stmt.name_hint in names or stmt.init is not None or not sch.get_consumers(block):
                continue
            if calls_math(stmt.body) and len(sch.get_consumers(block)) > 1:
                continue
            if inlines_a_constant(sch, block, reverse=False) or inlines_too_much(sch, block, reverse=False):
                continue
            try:
                sch.compute_inline(block)
            except s_tir.ScheduleError:
                continue
            changed = True
            break


def _compute_at(sch: s_tir.Schedule, block: SBlockRV, loop: LoopRV) -> None:
    """``compute_at`` of a block without a predicate: TVM 0.27 rebuilds the block's loops
    from its iter domain and drops a predicate it had (an ``rfactor`` block then reads
    past the end of its keys)."""
    realize = get_sblockrealize(sch, block)
    if realize is None or not is_one(realize.predicate):
        raise s_tir.ScheduleError("compute_at would drop the block's predicate")
    sch.compute_at(block, loop, preserve_unit_loops=False)


def _tile_loop(sch: s_tir.Schedule, block: SBlockRV, rows: int, head_major: bool = True) -> LoopRV:
    """The matmul's (batch, row tile) loop: its i loop split by ``rows``, fused with the
    batch axes (the heads) outside it.  A core's chunk of the parallel loop then runs a
    head's row tiles one after another, which all read that head's kᵀ and v from L2;
    with the row tiles outside, each step read another head's, and 12 heads' kᵀ and v
    (1.3-1.7 MiB at 197-257 tokens) do not fit a 1 MiB L2 (the same bits either way).
    At a symbolic row count the row tiles stay outside: the lowering gives each tile's
    softmax buffers one head only when the heads are the inner, constant part of the fused
    index (``index_forms.FoldNestedMods``).  ``head_major=False`` (the rule before,
    ``CompileOptions.attention_head_major``) keeps the row tiles outside at every count."""
    *batch, i, j, k = sch.get_loops(block)
    if not head_major:
        outer, inner = sch.split(i, [None, rows])
        sch.reorder(outer, *batch, inner, j, k)
        return sch.fuse(outer, *batch)
    symbolic = static_extent(sch.get(i).extent) is None
    outer, inner = sch.split(i, [None, rows])
    fused = [outer, *batch] if symbolic else [*batch, outer]
    sch.reorder(*fused, inner, j, k)
    return sch.fuse(*fused)


def _under(sch: s_tir.Schedule, block: SBlockRV, loop: LoopRV) -> list[LoopRV]:
    """The loops of ``block`` inside ``loop``."""
    loops = sch.get_loops(block)
    target = sch.get(loop)
    for index, candidate in enumerate(loops):
        if sch.get(candidate).same_as(target):
            return loops[index + 1:]
    raise s_tir.ScheduleError("block is not under the tile loop")


def _schedule_pack(sch: s_tir.Schedule, pack: SBlockRV, plan: AttentionPlan, key_panels: bool = True,
                   parallel: bool = True) -> None:
    """kᵀ ``[b, k, keys]`` from k stored ``[keys, k]``, in panels of a register tile's keys
    (``_key_panels``): blocks of lanes keys x head vectors, read along the head dimension
    (whole vectors), written a key at a time (faster on ViT-B/16 than
    gathering a vector of keys per store); ``key_panels=False``: kᵀ row-major, as before.
    ``parallel=False``: the pack sits in a tile of the parallel loop (its loops stay serial)."""
    if key_panels:
        _key_panels(sch, pack, plan)
    *outer, head, keys = sch.get_loops(pack)
    whole = _divides(sch, keys, plan.lanes) and _divides(sch, head, plan.head_lanes)
    if not whole or plan.head_lanes < 4:
        vectorize_innermost(sch, keys, plan.lanes)
        if parallel:
            sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
        return
    keys_outer, keys_inner = sch.split(keys, [None, plan.lanes])
    head_outer, head_inner = sch.split(head, [None, plan.head_lanes])
    sch.reorder(keys_outer, head_outer, keys_inner, head_inner)
    sch.vectorize(head_inner)
    sch.unroll(keys_inner)
    if parallel:
        sch.parallel(sch.fuse(*outer, keys_outer))


def _key_panels(sch: s_tir.Schedule, pack: SBlockRV, plan: AttentionPlan) -> None:
    """kᵀ stored ``[b, keys / width, k, width]`` (``width`` the keys of a q·kᵀ register
    tile) when ``width`` divides the padded keys: a tile's step along the head dimension
    then reads the next ``width`` floats, not a row ``keys`` floats on (at 512 or 1024
    keys those rows are 2-4 KiB apart and share a few L1 sets).  A layout change of the
    packed copy alone (``transform_layout`` rewrites its every access)."""
    width = plan.key_width
    extent = sch.get(pack).writes[0].source.shape[-1]
    if not Analyzer().can_prove(tirx.floormod(extent, width) == 0):
        return
    _in_panels(sch, pack, width)


def _in_panels(sch: s_tir.Schedule, pack: SBlockRV, width: int) -> None:
    """The buffer ``pack`` writes, ``[..., rows, n]``, stored ``[..., n / width, rows,
    width]``: each ``width`` columns a panel, its rows contiguous (``transform_layout``
    rewrites every access of it)."""
    sch.transform_layout(pack, ("write", 0), lambda *index: (*index[:-2], index[-1] // width,
                                                             index[-2], index[-1] % width))


def _pack_v(sch: s_tir.Schedule, pack: SBlockRV, plan: AttentionPlan, head: int) -> None:
    """v ``[b, keys, d]`` stored ``[b, d / width, keys, width]``, ``width`` the head
    dimensions of a p·v register tile (``d / head_splits``): each register tile then reads
    its slice of v as one contiguous run of keys.  Read in place from a projection's output
    (rows of all heads: 3 KiB apart in Whisper's combined k and v projection), a slice's
    keys are one cache line each at a stride that maps them to a sixteenth of L2's sets: a
    head's v left L2 between row tiles.  A parallel copy, before the tile loop, of whole
    vectors.  Not where one row tile covers a head (a decode step): there the copy would
    double the reads of v."""
    width = head // plan.head_splits
    _in_panels(sch, pack, width)
    *outer, keys, dims = sch.get_loops(pack)
    part, inner = sch.split(dims, [None, width])
    sch.reorder(part, keys, inner)
    sch.parallel(sch.fuse(*outer, part, keys))
    vectorize_innermost(sch, inner, plan.lanes)


def _is_parameter(sch: s_tir.Schedule, buffer: tirx.Buffer) -> bool:
    return any(param.same_as(buffer) for param in sch.mod["main"].params)


def _divides(sch: s_tir.Schedule, loop: LoopRV, factor: int) -> bool:
    return Analyzer().can_prove(tirx.floormod(sch.get(loop).extent, factor) == 0)


def _rows_and(sch: s_tir.Schedule, block: SBlockRV, tile: LoopRV) -> tuple[list[LoopRV], list[LoopRV]]:
    """A matmul's loops under the tile: its row loop (none when ``compute_at`` dropped a
    tile of one row) and the other two."""
    loops = _under(sch, block, tile)
    return (loops[:1], loops[1:]) if len(loops) == 3 else ([], loops)


def _schedule_qk(sch: s_tir.Schedule, qk: SBlockRV, tile: LoopRV, plan: AttentionPlan) -> None:
    """rows x key_vectors vectors of scores accumulated over k in registers.  A constant key
    count of no whole register tiles (one pass: the consumers' count) is split first into
    the whole tiles, whole vectors and a tail of less than a vector: the key loop moved
    outside the rows and partitioned (``loop_partition`` of a spatial loop over the one
    matmul block, before its init is split off), each part a register tile of its own.
    (A tail of 24 or 28 keys as one vector ran Whisper's 1500 keys 3% slower than two
    passes; cut at whole vectors, the tail under one vector, it ran as fast as the others.)"""
    rows, (keys, k) = _rows_and(sch, qk, tile)
    static = static_extent(sch.get(keys).extent)
    if static is not None and static > plan.key_width and static % plan.key_width:
        if rows:
            sch.reorder(keys, *rows)
        tiles = static // plan.key_width * plan.key_width
        vectors = (static - tiles) // plan.lanes * plan.lanes
        sizes = [size for size in (tiles, vectors, static - tiles - vectors) if size]
        parts = sch.loop_partition(keys, sizes[:-1] + [None])
        for part, width in zip(parts, (plan.key_vectors, None, None)):  # only the first starts at 0
            _register_tile(sch, sch.get_child_blocks(part)[0], part, width, plan)
        return
    if not _divides(sch, keys, plan.key_width):
        return  # a single key (not padded): nothing to vectorize
    symbolic = static_extent(sch.get(keys).extent) is None
    outer = _register_steps(sch, keys, [None, plan.key_vectors, plan.lanes], k, rows)
    if symbolic:
        _accumulate_locally(sch, qk, outer, plan.lanes)
    _init_vectorized(sch, qk, k)


def _register_tile(sch: s_tir.Schedule, block: SBlockRV, keys: LoopRV, vectors: int | None,
                   plan: AttentionPlan) -> None:
    """One part of a partitioned q·kᵀ (loops keys, rows, k): rows x ``vectors`` vectors of
    keys a step of k (``None``: all its keys as one vector, whole ones or the tail's short
    one: ``split`` takes no loop that starts past 0, as the parts after the first do)."""
    loops = sch.get_loops(block)
    at = next(i for i, loop in enumerate(loops) if sch.get(loop).same_as(sch.get(keys)))
    *rows, k = loops[at + 1:]
    if vectors is None:
        sch.reorder(k, *rows, keys)
        sch.vectorize(keys)
        for loop in rows:
            sch.unroll(loop)
    else:
        _register_steps(sch, keys, [None, vectors, plan.lanes], k, rows)
    _init_vectorized(sch, block, k)


def _register_steps(sch: s_tir.Schedule, spatial: LoopRV, factors: list[int | None], reduction: LoopRV,
                    rows: list[LoopRV]) -> LoopRV:
    """A register tile: ``spatial`` split by ``factors`` into (outer, vectors, lanes), the
    loops ordered (outer, ``reduction``, rows, vectors, lanes), the lanes vectorized, the
    vectors and rows unrolled; the outer loop."""
    outer, vectors, lanes = sch.split(spatial, factors)
    sch.reorder(outer, reduction, *rows, vectors, lanes)
    sch.vectorize(lanes)
    sch.unroll(vectors)
    for loop in rows:
        sch.unroll(loop)
    return outer


def _init_vectorized(sch: s_tir.Schedule, block: SBlockRV, reduction: LoopRV) -> None:
    """``block``'s init split off above ``reduction``, its innermost loop vectorized."""
    init = sch.decompose_reduction(block, reduction)
    sch.vectorize(sch.get_loops(init)[-1])


def _accumulate_locally(sch: s_tir.Schedule, block: SBlockRV, tile: LoopRV, lanes: int) -> None:
    """The register tile of ``block`` accumulated in a local buffer of constant shape and
    copied out once per ``tile``.  Accumulated in place, rows of a symbolic key count are a
    symbolic stride apart, LLVM cannot prove two rows' vectors disjoint and keeps every
    accumulator in memory (a load and a store per FMA).
    ``reverse_compute_at`` is safe here: the copy reads exactly the tile the padded
    matmul computes, so no consumer point is left uncovered (module docstring)."""
    local = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(local, tile, preserve_unit_loops=True)
    vectorize_innermost(sch, sch.get_loops(local)[-1], lanes)


def _schedule_pv(sch: s_tir.Schedule, pv: SBlockRV, tile: LoopRV, plan: AttentionPlan) -> None:
    """rows x (head vectors / head_splits) vectors of the output accumulated over the keys."""
    rows, (head, keys) = _rows_and(sch, pv, tile)
    _register_steps(sch, head, [plan.head_splits, None, plan.head_lanes], keys, rows)
    _init_vectorized(sch, pv, keys)


def _schedule_row_block(sch: s_tir.Schedule, block: SBlockRV, tile: LoopRV, lanes: int,
                        math_vectors: int = 1) -> None:
    """A row block under the tile: spatial ones vectorized over the keys (``math_vectors``
    vectors a step where it calls a math function: the softmax's exp); a max's lane
    block (``_split_max``) vectorized over its lanes; other reductions keep each row's
    order, float ones interleaving the tile's rows to hide the latency."""
    loops = _under(sch, block, tile)
    stmt = sch.get(block)
    if not loops:
        return
    if stmt.init is None:
        _vectorize_keys(sch, loops[-1], lanes * math_vectors if calls_math(stmt.body) else lanes)
        return
    keys = [loop for loop in loops if _binds_reduction(sch, block, loop)]
    rows = [loop for loop in loops if not any(sch.get(loop).same_as(sch.get(k)) for k in keys)]
    if len(keys) != 1:
        return
    if stmt.name_hint.endswith("_rf"):  # (lane, row, key vector): lanes innermost, vectorized
        sch.reorder(*rows[1:], keys[0], rows[0])
        sch.vectorize(rows[0])
        init = sch.decompose_reduction(block, keys[0])
        sch.vectorize(sch.get_loops(init)[-1])
    elif len(rows) == 1 and stmt.writes[0].source.dtype.startswith("float"):
        sch.reorder(keys[0], rows[0])
        sch.unroll(rows[0])


def _binds_reduction(sch: s_tir.Schedule, block: SBlockRV, loop: LoopRV) -> bool:
    """Whether ``loop`` steps a reduction iter of ``block``."""
    realize = get_sblockrealize(sch, block)
    var = sch.get(loop).loop_var
    return any(
        iv.iter_type == tirx.IterVar.CommReduce
        and any(v.same_as(var) for v in tirx.analysis.undefined_vars(value))
        for iv, value in zip(realize.block.iter_vars, realize.iter_values)
    )


def _split_lanes(sch: s_tir.Schedule, blocks: list[SBlockRV], lanes: int, sums: bool) -> list[SBlockRV]:
    """``blocks`` with each float max over a multiple of ``lanes`` keys split by ``rfactor``
    into a max per lane and a max of the lanes; with ``sums`` (the ``relaxed`` numeric
    level) each float sum too, into a sum per lane (keys ``l, l + lanes, ...`` in order)
    and the lanes' sums in order.  A max is exact in any order (NaN aside, and a NaN score
    makes its whole row NaN either way), a sum is not: at the ``exact`` level sums stay
    serial.  A key count that is not a multiple would leave the lane block a predicate that
    ``compute_at`` drops; after ``pad_max`` a symbolic or constant one is a multiple for
    the max (a sum over such keys stays serial)."""
    out = []
    for block in blocks:
        stmt = sch.get(block)
        keys = sch.get_loops(block)[-1]
        extent = static_extent(sch.get(keys).extent)
        split = is_float_max(stmt) or (sums and is_float_sum(stmt))
        if split and _divides(sch, keys, lanes) and (extent is None or extent > lanes):
            _, lane = sch.split(keys, [None, lanes])
            out.append(sch.rfactor(lane, factor_axis=len(stmt.writes[0].region)))  # lanes innermost
        out.append(block)
    return out


def _vectorize_keys(sch: s_tir.Schedule, loop: LoopRV, lanes: int) -> None:
    """Whole vectors, then the tail: a constant one as its own short vector loop
    (``loop_partition``), a symbolic one as the predicated last vector, split off at
    lowering (``split_vector_tail``; otherwise its predicate scalarizes every vector)."""
    static = static_extent(sch.get(loop).extent)
    if static is not None and static <= lanes:
        sch.vectorize(loop)
        return
    if static is None:
        sch.vectorize(split_vector_tail(sch, loop, lanes)[1])
        return
    if static % lanes == 0:
        sch.vectorize(sch.split(loop, [None, lanes])[1])
        return
    if not _is_leaf(sch, loop):
        return
    main, tail = sch.loop_partition(loop, [static // lanes * lanes, None])
    sch.vectorize(sch.split(main, [None, lanes])[1])
    sch.vectorize(tail)


def _computes_once(sch: s_tir.Schedule, block: SBlockRV, tile: LoopRV, rows: int) -> bool:
    """Whether one tile iterates at most ``rows`` rows of ``block``: the loops under the
    tile, against the extents of the iters not bound to the tile.  ``compute_at`` covers
    every point a tile needs; when it also covers more, tiles compute shared points, and
    in the parallel loop one tile could read a row another is still writing."""
    realize = get_sblockrealize(sch, block)
    if realize is None:
        return False
    var = sch.get(tile).loop_var
    work, free = tirx.const(1, "int64"), tirx.const(rows, "int64")
    for loop in _under(sch, block, tile):
        work = work * tirx.Cast("int64", sch.get(loop).extent)
    for iv, value in zip(realize.block.iter_vars, realize.iter_values):
        if not any(v.same_as(var) for v in tirx.analysis.undefined_vars(value)):
            free = free * tirx.Cast("int64", iv.dom.extent)
    analyzer = Analyzer()
    for dim in tirx.analysis.undefined_vars(work - free):  # shape vars: a key count is never negative
        analyzer.bind(dim, tvm.ir.Range.from_min_extent(tirx.const(0, "int64"), tirx.const(2**62, "int64")))
    return analyzer.can_prove(work <= free)


def _is_leaf(sch: s_tir.Schedule, loop: LoopRV) -> bool:
    """Whether ``loop``'s body is one block realize (what ``loop_partition`` handles)."""
    return isinstance(sch.get(loop).body, s_tir.SBlockRealize)


def _one_pass(keys: int | None, plan: AttentionPlan, tail: bool = True) -> bool:
    """Whether q·kᵀ runs in the tile loop of the softmax and p·v (one pass, its scores
    read back from L1): at a constant key count, where ``compute_at`` leaves the key loop
    at the consumers' count; ``_schedule_qk`` splits a count of more than one register
    tile but no whole number of them into whole tiles and a tail (``tail=False``: only
    counts of whole tiles, as before; under one tile's keys, two passes).
    A symbolic count keeps two passes: the consumers need fewer keys than the padded tile
    computes, and ``compute_at`` would shrink the key loop to a symbolic count."""
    return keys is not None and (keys % plan.key_width == 0 or tail and keys > plan.key_width)


def schedule_attention(sch: s_tir.Schedule, found: AttentionBlocks, target: Target,
                       options: CompileOptions | None = None) -> bool:
    """Schedule ``sch`` in place (module docstring, steps 1-5); False when a tile would
    compute rows of another (``sch`` is then half-scheduled: drop it).  ``options``
    (the default ones when None) may ask for the tile-major loop or two passes."""
    options = options_or_default(options)
    head_major, one_pass = options.attention_head_major, options.attention_one_pass
    lanes = float32_lanes(target)
    qk_stmt, pv_stmt = sch.get(found.qk), sch.get(found.pv)
    m, n = (static_extent(iv.dom.extent) for iv in qk_stmt.iter_vars[-3:-1])
    head = static_extent(pv_stmt.iter_vars[-2].dom.extent)
    plan = plan_attention(m, n, head, lanes, vector_registers(target), options.attention_full_register_tile)
    for block in (found.qk, found.pv):
        for index in (0, 1):
            _operand_copy(sch, block, index)
    qk_factors = _pad_factors(qk_stmt, {-3: plan.rows, -2: plan.key_width})
    if any(f > 1 for f in qk_factors):
        sch.pad_einsum(found.qk, qk_factors)
    pv_factors = _pad_factors(pv_stmt, {-3: plan.rows})
    if any(f > 1 for f in pv_factors):
        sch.pad_einsum(found.pv, pv_factors)
    q_copy, k_pack = _operand_copy(sch, found.qk, 0), _operand_copy(sch, found.qk, 1)
    p_copy = _operand_copy(sch, found.pv, 0)
    v_pack = None
    if options.attention_pack_v and m is not None and m > plan.rows and head is not None:
        v_pack = _operand_copy(sch, found.pv, 1)
        if _is_parameter(sch, sch.get(v_pack).writes[0].source):
            v_pack = None  # v is also an output of the kernel: its layout is the caller's
    _inline_views(sch, [q_copy, k_pack, p_copy, *([v_pack] if v_pack is not None else [])])
    children = sch.get_child_blocks(get_root_block(sch))
    names = [sch.get(b).name_hint for b in children]
    start, stop = names.index(qk_stmt.name_hint), names.index(sch.get(p_copy).name_hint)
    row_blocks = [b for b in children[start + 1: stop]
                  if v_pack is None or sch.get(b).name_hint != sch.get(v_pack).name_hint]
    outputs = children[names.index(pv_stmt.name_hint) + 1:]

    row_blocks = _split_lanes(sch, row_blocks, lanes, sums=is_relaxed(sch.mod["main"]))
    context = _tile_loop(sch, found.pv, plan.rows, head_major)
    for block in (p_copy, *reversed(row_blocks)):
        _compute_at(sch, block, context)
    placed = [(block, context) for block in (*row_blocks, p_copy)]
    if one_pass and _one_pass(n, plan, options.attention_one_pass_tail):
        _compute_at(sch, found.qk, context)
        scores = context
        placed.append((found.qk, context))
    else:
        scores = _tile_loop(sch, found.qk, plan.rows, head_major)
    _compute_at(sch, q_copy, scores)
    placed.append((q_copy, scores))
    # every row of a head in one tile (a decode step's one query row): kᵀ is packed per
    # head inside the tile, from L2, instead of all heads' kᵀ through memory first
    pack_in_tile = options.attention_pack_in_tile and m is not None and m <= plan.rows
    if pack_in_tile:
        _compute_at(sch, k_pack, scores)
        placed.append((k_pack, scores))
    if not all(_computes_once(sch, block, tile, plan.rows) for block, tile in placed):
        return False
    sch.parallel(context)
    if scores is not context:
        sch.parallel(scores)
    _schedule_pack(sch, k_pack, plan, key_panels=one_pass or pack_in_tile, parallel=not pack_in_tile)
    vectorize_innermost(sch, sch.get_loops(q_copy)[-1], lanes)
    _schedule_qk(sch, found.qk, scores, plan)
    for block in [*row_blocks, p_copy]:
        _schedule_row_block(sch, block, context, lanes, options.attention_exp_vectors)
    _schedule_pv(sch, found.pv, context, plan)
    if v_pack is not None:
        _pack_v(sch, v_pack, plan, head)
    for block in outputs:
        schedule_injective(sch, block, lanes)
    note_plan(sch, found.pv, ", ".join([
        f"tile {plan.rows} rows x {plan.key_vectors} key vectors",
        f"head dim in {plan.head_splits} part(s) of {plan.part_vectors(head)} vectors" if head is not None
        else f"head dim in vectors of {plan.head_lanes} lanes",
        "one pass" if scores is context else "two passes",
        "head-major" if head_major else "tile-major",
        "kᵀ packed per head in the tile" if pack_in_tile else "kᵀ packed in panels" if one_pass else "kᵀ packed",
        "v packed in slices" if v_pack is not None else "v in place"]))
    return True


class Attention(CPUScheduleRule):
    """Two-pass tiled schedule for attention PrimFuncs (see the module docstring), with the
    knobs of ``options`` (the default ones when None)."""

    def __init__(self, options: CompileOptions | None = None) -> None:
        self.options = options_or_default(options)

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        if count_matmuls(func) != 2:
            return None  # cheap test first: the rule sees every CPU kernel
        simplified = s_tir.transform.StmtSimplify()(tvm.IRModule({"main": func}))["main"]
        if self.options.attention_lane_max:  # a row max over whole vectors of keys
            simplified = pad_max(simplified, float32_lanes(target))
        sch = s_tir.Schedule(simplified)
        found = find_attention(sch)
        if found is None:
            return None
        try:
            if not schedule_attention(sch, found, target, self.options):
                return None
        except s_tir.ScheduleError:
            return None
        func = sch.mod["main"]
        try:  # steps 6 and 7 (each leaves a function it does not recognize as it is)
            rewritten = func
            if self.options.attention_skip_masked:
                rewritten = skip_masked_keys(rewritten, float32_lanes(target))
            if self.options.attention_unswitch_rows:
                rewritten = unswitch_unrolled_rows(rewritten)
            return sch if rewritten.same_as(func) else s_tir.Schedule(rewritten)
        except Exception as err:  # noqa: BLE001 - the kernel as scheduled is right, only slower
            _LOG.warning("attention: masked keys / row unswitch not applied (%s)", str(err).splitlines()[0][:200])
            return sch
