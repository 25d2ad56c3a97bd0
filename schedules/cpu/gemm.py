"""CPU GEMM schedule rule: a packed, register-blocked BLIS kernel with the epilogue fused.

Accepts a PrimFunc with exactly one reduction block of GEMM shape (see
``gemm_analysis``): plain, batched (3-D/4-D) or transposed-operand matmul, with injective
producers (``permute_dims`` of the weight) and consumers (bias add, relu/gelu/silu,
residual add). Extents may be symbolic (``gemm_plan``: padded at run time to whole tiles).
Anything else -- a second reduction, a reduction that is not a multiply-accumulate -- gets
``None`` so that the next rule handles it.

The schedule, after ``normalize_gemm`` has rewritten the block to
``C[S, M, N] += A[S, M, K] * B[S, N, K]`` (``reindex``; for a conv2d this is im2col):

1. ``pad_einsum`` pads M, N (and K if needed) to the tile sizes of ``gemm_plan``;
2. producers of A and B are inlined into the reindex/pad copies, so each operand is read
   once by one copy block; B's copy writes the packed layout ``[S, N/nr, K, nr]``
   (``transform_layout``), A's copy is inlined away when it is a plain load;
3. the BLIS loop nest (``gemm_plan`` docstring), ``mr`` unrolled and ``nr`` vectorised,
   the init split off with ``decompose_reduction``;
4. consumers are inlined into one epilogue block, placed after the reduction of each
   parallel chunk (``reverse_compute_at``) when it reads C at plain indices; one that
   reads C's rows through a view (``C[b * s + t, n]``) is first iterated over C's rows
   (``gemm_blocks.iterate_as_read``); otherwise (conv positions y*W + x under an NCHW
   store) it runs as a separate parallel pass: TVM 0.27's ``reverse_compute_at``
   silently under-covers fused indices (see ``reads_plainly``).

Every step is a TensorIR primitive that checks its own preconditions, so a shape this
module did not foresee raises inside ``apply``, which then returns None.

``prepare_gemm`` does the normalisation and inlining, ``tile_gemm`` steps 1-4 for a given
plan.  ``apply(..., tunable=True)`` forks the prepared schedule once per
``gemm_plan.plan_candidates`` plan (``gemm_spaces``) and samples the block sizes there:
those are the design spaces ``aicf tune`` searches (``schedules.tuning.space``).  Untuned,
nothing is sampled and the schedule is the one described above.  ``Gemm.choices`` gives
each candidate plan's complete schedule (nothing sampled) with its ``plan_choice``, and
``Gemm.apply_choice`` schedules by one of them: a kernel with symbolic extents is tuned and
compiled that way (``schedules.tuning.symbolic``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tvm import s_tir, tirx
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.s_tir.schedule import LoopRV, SBlockRV
from tvm.sym.analyzer import Analyzer
from tvm.target import Target

from aicf_tvm.core.options import CompileOptions, options_or_default

from .common import (
    PARTITION_HINT,
    calls_math,
    float32_lanes,
    gemm_tiles_by_area,
    loop_extent,
    note_plan,
    num_cores,
    static_extent,
    vector_registers,
)
from .gemm_analysis import (
    GemmTraits,
    IterRole,
    NormalizedGemm,
    detect_gemm,
    inline_dequantized_operand,
    normalize_gemm,
)
from .gemm_blocks import (
    copies_a_constant,
    find_reduction_block,
    inline_consumers,
    inline_producers,
    is_plain_load,
    iterate_as_read,
    last_index_is_iter,
    mark_prepack,
    schedule_injective,
    splits_into_vectors,
)
from .gemm_plan import (
    GemmPlan,
    chosen_plan,
    least_padded_area,
    plan_candidates,
    plan_choice,
    plan_gemm,
)
from .gemm_prefetch import mark_loops, prefetch_pays


def choose_vector_role(traits: GemmTraits, lanes: int, preferred: IterRole,
                       tile_by_area: bool = False) -> IterRole:
    """The axis (I or J) to vectorise: the one whose tiles pad the problem least (tiles
    chosen as ``plan_gemm`` chooses them; with ``tile_by_area``, the least padding of its
    candidates).

    N pads to a multiple of 16..64 and M only to one of ~6, so a 7-wide N wastes half the
    vector lanes while the same axis as M wastes nothing; ``preferred`` wins ties.  A
    symbolic axis is N only when both are (it is then padded to whole vectors).
    """
    if IterRole.I not in traits.block or IterRole.J not in traits.block:
        return IterRole.I if IterRole.I in traits.block else IterRole.J
    static = [r for r in (IterRole.I, IterRole.J) if traits.is_static(r)]
    if len(static) < 2:
        return static[0] if static else preferred
    batch = traits.extent(IterRole.S) if traits.is_static(IterRole.S) else 1
    k = traits.extent(IterRole.K)
    i_ext, j_ext = traits.extent(IterRole.I), traits.extent(IterRole.J)

    def padded_work(m: int, n: int) -> int:
        if tile_by_area:  # the axes compared by their least padding, not the slack the tile takes
            return least_padded_area(m, n, lanes)
        plan = plan_gemm(batch, m, n, k, lanes, cores=1)
        return plan.m_padded * plan.n_padded

    work = {IterRole.J: padded_work(i_ext, j_ext), IterRole.I: padded_work(j_ext, i_ext)}
    other = IterRole.I if preferred == IterRole.J else IterRole.J
    return other if work[other] < work[preferred] else preferred


def _operand_producers(
    sch: s_tir.Schedule, main: SBlockRV, a_read: int
) -> tuple[SBlockRV, SBlockRV]:
    """The blocks producing A and B, A being the block's ``a_read``-th read."""
    stmt = sch.get(main)
    buffers = [stmt.reads[a_read].source, stmt.reads[1 - a_read].source]
    found: list[SBlockRV | None] = [None, None]
    for producer in sch.get_producers(main):
        written = sch.get(producer).writes[0].source
        for i, buf in enumerate(buffers):
            if written.same_as(buf):
                found[i] = producer
    if found[0] is None or found[1] is None:
        raise s_tir.ScheduleError("GEMM operands are not produced by copy blocks")
    return found[0], found[1]


def _schedule_pack(sch: s_tir.Schedule, block: SBlockRV, plan: GemmPlan) -> None:
    s, n, k = sch.get_loops(block)
    n_outer, n_inner = sch.split(n, [None, plan.nr])
    if last_index_is_iter(sch, block, 2) and splits_into_vectors(sch, k, plan.lanes):
        # a transposing pack (B stored [N, K], e.g. a Linear weight): read K-contiguous
        # vectors and write them out strided, in lanes x nr blocks that stay in L1
        k_outer, k_inner = sch.split(k, [None, plan.lanes])
        sch.reorder(s, n_outer, k_outer, n_inner, k_inner)
        sch.unroll(k_inner)
    else:
        sch.reorder(s, n_outer, k, n_inner)
        sch.vectorize(n_inner)
    sch.parallel(sch.fuse(s, n_outer))


def _schedule_im2col(sch: s_tir.Schedule, block: SBlockRV, lanes: int) -> None:
    """The im2col copy (loops already ``S, K, rows``): parallel over K, row loop innermost."""
    loops = sch.get_loops(block)
    inner = loops[-1]
    if splits_into_vectors(sch, inner, lanes):
        sch.vectorize(sch.split(inner, [None, lanes])[1])
    sch.parallel(sch.fuse(*loops[: max(1, len(loops) - 2)]))


@dataclass(frozen=True)
class GemmProblem:
    """A GEMM block after ``normalize_gemm`` and producer inlining, before tiling: what
    ``plan_gemm`` decides on (extents, None when symbolic; B's source layout)."""

    norm: NormalizedGemm
    dims: tuple[int | None, int | None, int | None, int | None]  # S, M, N, K
    lanes: int
    cores: int
    b_contiguous_in_n: bool
    registers: int = 32
    tile_by_area: bool = False
    options: CompileOptions | None = None  # the rule's knobs (the default ones when None)
    b_constant: bool = False  # B copies a weight that is packed once, at compile time
    epilogue_math: bool = False  # the function calls a math function (its epilogue: GELU's erf)

    def plan_args(self) -> tuple:
        """``plan_gemm``'s / ``plan_candidates``' arguments for this problem."""
        return (*self.dims, self.lanes, self.cores, self.registers, self.b_contiguous_in_n,
                self.norm.b_im2col, self.tile_by_area, self.options, self.b_constant, self.epilogue_math)


def prepare_gemm(
    sch: s_tir.Schedule, main: SBlockRV, traits: GemmTraits, vector_role: IterRole, target: Target,
    options: CompileOptions | None = None,
) -> GemmProblem:
    """Normalise the GEMM block ``main`` and inline the producers of its operand copies."""
    lanes = float32_lanes(target)
    norm = normalize_gemm(sch, main, traits, vector_role)
    for copy, im2col in ((norm.a_copy, norm.a_im2col), (norm.b_copy, norm.b_im2col)):
        if im2col:  # keep the padded input: inlined, im2col would test bounds per element
            for producer in sch.get_producers(copy):
                inline_producers(sch, producer)
                schedule_injective(sch, producer, lanes)
        else:
            inline_producers(sch, copy)
    dims = tuple(static_extent(iv.dom.extent) for iv in sch.get(main).iter_vars)
    contiguous = norm.b_im2col or last_index_is_iter(sch, norm.b_copy, 1)
    return GemmProblem(norm, dims, lanes, num_cores(target), contiguous, vector_registers(target),
                       gemm_tiles_by_area(target), options,
                       not norm.b_im2col and copies_a_constant(sch, norm.b_copy), calls_math(sch.mod["main"].body))


def schedule_gemm(
    sch: s_tir.Schedule,
    main: SBlockRV,
    traits: GemmTraits,
    vector_role: IterRole,
    target: Target,
    choice: Mapping[str, Any] | None = None,
    options: CompileOptions | None = None,
) -> GemmPlan:
    """Schedule the GEMM block ``main`` (and its producers/consumers) in place, by the
    default plan or the candidate ``choice`` names (ValueError when none does), with the
    knobs of ``options``."""
    problem = prepare_gemm(sch, main, traits, vector_role, target, options)
    plan = plan_gemm(*problem.plan_args()) if choice is None else chosen_plan(choice, *problem.plan_args())
    if plan is None:
        raise ValueError(f"{dict(choice or {})} is not a plan candidate of this GEMM")
    tile_gemm(sch, main, problem, plan, vector_role, sample=False)
    return plan


def plan_schedules(
    sch: s_tir.Schedule, main: SBlockRV, traits: GemmTraits, vector_role: IterRole, target: Target,
    options: CompileOptions | None = None,
) -> list[tuple[dict, s_tir.Schedule]]:
    """Each ``plan_candidates`` plan's complete schedule (nothing sampled) with its
    ``plan_choice``, the default plan's first; a plan that does not fit is left out."""
    return _plan_spaces(sch, main, traits, vector_role, target, sample=False, options=options)


def gemm_spaces(
    sch: s_tir.Schedule, main: SBlockRV, traits: GemmTraits, vector_role: IterRole, target: Target,
    options: CompileOptions | None = None,
) -> list[s_tir.Schedule]:
    """The tuning design spaces of ``main``: one schedule per ``plan_candidates`` plan, the
    default first, each sampling its block sizes with the plan's as the decision."""
    return [space for _, space in _plan_spaces(sch, main, traits, vector_role, target, sample=True,
                                               options=options)]


def _plan_spaces(sch: s_tir.Schedule, main: SBlockRV, traits: GemmTraits, vector_role: IterRole,
                 target: Target, sample: bool,
                 options: CompileOptions | None = None) -> list[tuple[dict, s_tir.Schedule]]:
    problem = prepare_gemm(sch, main, traits, vector_role, target, options)
    out = []
    for plan in plan_candidates(*problem.plan_args()):
        space = sch.copy()
        try:
            tile_gemm(space, main, problem, plan, vector_role, sample=sample)
        except Exception:  # noqa: BLE001 - ScheduleError / InternalError: this plan does not fit
            continue
        out.append((plan_choice(plan), space))
    return out


def tile_gemm(
    sch: s_tir.Schedule,
    main: SBlockRV,
    problem: GemmProblem,
    plan: GemmPlan,
    vector_role: IterRole,
    sample: bool,
) -> None:
    """Pad, pack and tile the prepared GEMM by ``plan``: the BLIS nest, the epilogue placed.

    ``sample``: the block sizes of static extents are ``sample_perfect_tile`` decisions
    (``plan``'s values), which MetaSchedule's search mutates; every loop level is then kept,
    one tile per block included.
    """
    norm, lanes = problem.norm, problem.lanes
    a_copy, b_copy = norm.a_copy, norm.b_copy
    extents = [iv.dom.extent for iv in sch.get(main).iter_vars[1:]]
    factors = [
        _pad_factor(extent, padded, tile)
        for extent, padded, tile in zip(extents, (plan.m_padded, plan.n_padded, plan.k_padded), (plan.mr, plan.nr, 1))
    ]
    if any(f > 1 for f in factors):
        sch.pad_einsum(main, [1, *factors])
        # normalize_gemm keeps the read order: A is the left operand unless N is its axis
        a_pad, b_pad = _operand_producers(sch, main, 0 if vector_role == IterRole.J else 1)
        if not a_pad.same_as(a_copy) and not norm.a_im2col:
            inline_producers(sch, a_pad)
        if not b_pad.same_as(b_copy) and not norm.b_im2col:
            inline_producers(sch, b_pad)
        for copy, pad, im2col in ((a_copy, a_pad, norm.a_im2col), (b_copy, b_pad, norm.b_im2col)):
            if im2col:
                _schedule_im2col(sch, copy, lanes)
                if not pad.same_as(copy):
                    schedule_injective(sch, pad, lanes)
        a_copy, b_copy = a_pad, b_pad
    else:
        for copy, im2col in ((a_copy, norm.a_im2col), (b_copy, norm.b_im2col)):
            if im2col:
                _schedule_im2col(sch, copy, lanes)
    if plan.pack_b:
        sch.transform_layout(
            b_copy, ("write", 0), lambda s, j, r: (s, j // plan.nr, r, j % plan.nr)
        )
        _schedule_pack(sch, b_copy, plan)
        mark_prepack(sch, b_copy, plain_only=sample)  # a constant B: packed once, at compile time
    elif not norm.b_im2col:
        sch.compute_inline(b_copy)  # small M, N-contiguous B: read in place
    if not norm.a_im2col:
        if is_plain_load(sch, a_copy):
            sch.compute_inline(a_copy)
        else:
            schedule_injective(sch, a_copy, lanes)  # a padded copy

    epilogue = inline_consumers(sch, main)
    s, m_loop, n_loop, k_loop = sch.get_loops(main)
    # a block of one tile gets no inner block loop (unless its size is sampled); a
    # symbolic M blocked by several strips splits off the strips past M at lowering
    if blocks_symbolic_m(plan):
        mo, *mi, mr = _split_strips(sch, m_loop, plan.mc, plan.mr)
    else:
        mo, *mi, mr = _split(sch, m_loop, plan.mc, plan.mr, sample)
    no, *ni, nr = _split(sch, n_loop, plan.nc, plan.nr * plan.panels, sample)
    panels = []  # the tile's B panels side by side (gemm_plan._row_panels), outside each panel's vectors
    if plan.panels > 1:
        panel, nr = sch.split(nr, [plan.panels, plan.nr])
        panels.append(panel)
    options = options_or_default(problem.options)
    # K in one block (untuned): not split, so that each register tile's init can sit right
    # above its K loop (decompose_reduction wants every reduction loop under it)
    one_block = (options.gemm_tile_epilogue and not sample and plan.kc is not None
                 and plan.k_padded == plan.kc)
    *ko, ki = [k_loop] if one_block else _split_k(sch, k_loop, plan.kc, sample)
    nv, nl = sch.split(nr, [None, lanes])
    if plan.parallel_m:
        sch.reorder(s, no, mo, *ko, *ni, *mi, ki, mr, *panels, nv, nl)
        chunk = sch.fuse(s, no, mo)
    else:
        sch.reorder(s, no, *ko, mo, *ni, *mi, ki, mr, *panels, nv, nl)
        chunk = sch.fuse(s, no)
    sch.parallel(chunk)
    for panel in panels:
        sch.unroll(panel)
    prefetch = (plan.pack_b and vector_role == IterRole.J and options.gemm_prefetch_b_panels
                and plan.panels == 1 and prefetch_pays(plan, problem.registers))
    if prefetch or options.blocked_sums:
        mark_loops(sch, ki, mi[-1] if mi else None, ni[-1] if ni else None, ko[-1] if ko else None,
                   plan.nr, sch.get(main).writes[0].source.dtype, prefetch=prefetch,
                   blocked_sums=options.blocked_sums)
    sch.unroll(mr)
    sch.unroll(nv)
    sch.vectorize(nl)
    tile = _tile_loop(sch, main, ki) if one_block else None
    # the init before the K loop of each register tile (one K block), else before the chunk's K blocks
    init = sch.decompose_reduction(main, ki if tile is not None else sch.get_loops(main)[1])
    sch.vectorize(sch.get_loops(init)[-1])
    on_tile = _place_epilogue(sch, main, epilogue, chunk, lanes, tile)
    note_plan(sch, main, describe_plan(plan, prefetch=prefetch, epilogue="tile" if on_tile else "chunk"))


def describe_plan(plan: GemmPlan, prefetch: bool, epilogue: str) -> str:
    """The plan's choices as ``aicf explain`` prints them."""
    def size(value: int | None) -> str:
        return "symbolic" if value is None else str(value)

    panels = f" x {plan.panels} B panels" if plan.panels > 1 else ""
    parts = [f"tile {plan.mr} rows x {plan.nr // plan.lanes} vectors{panels}",
             f"kc {size(plan.kc)}", f"mc {plan.mc}", f"nc {plan.nc}",
             "parallel over rows" if plan.parallel_m else "parallel over column blocks",
             "B packed" if plan.pack_b else "B in place", f"epilogue per {epilogue}"]
    return ", ".join(parts + (["B panels prefetched"] if prefetch else []))


def _tile_loop(sch: s_tir.Schedule, main: SBlockRV, ki: LoopRV) -> LoopRV | None:
    """The loop over register tiles just above the K loop ``ki`` of a GEMM whose K is one
    block: each tile's sum is whole when its K loop ends, so the init can start it in
    registers and the epilogue can run on it there, while it is in L1, instead of a pass
    zeroing the chunk's C before and one reading it back after.  None when the loop above
    ``ki`` is the parallel chunk itself."""
    loops = sch.get_loops(main)
    at = [i for i, loop in enumerate(loops) if sch.get(loop).same_as(sch.get(ki))]
    if not at or at[0] < 2:
        return None
    return loops[at[0] - 1]


def blocks_symbolic_m(plan: GemmPlan) -> bool:
    """Whether a symbolic M (padded to whole strips) is blocked by ``mc`` rows."""
    return plan.m_padded is None and plan.mc > plan.mr


def _split_strips(sch: s_tir.Schedule, loop: LoopRV, block: int, tile: int) -> list[LoopRV]:
    """A symbolic M padded to whole ``tile``-row strips, split into (blocks, strips, tile).

    The strips split exactly; the blocks do not, and the predicate that ends the last one
    is on the strip alone, with the strip loop carrying ``PARTITION_HINT``: lowering runs
    each block's whole strips without it, and the strips past M skip their whole body
    (``HoistIfThenElse`` lifts the strip's test above its K loop). A split of the rows
    into blocks in one step would test every row inside the K loop instead."""
    strips, rows = sch.split(loop, [None, tile])
    blocks, strip = sch.split(strips, [None, block // tile])
    sch.annotate(strip, PARTITION_HINT, tirx.IntImm("int32", 1))
    return [blocks, strip, rows]


def _split(sch: s_tir.Schedule, loop: LoopRV, block: int, tile: int, sample: bool) -> list[LoopRV]:
    """``loop`` split into (outer, inner blocks, tile), the middle loop only when a block
    holds more than one tile; with ``sample`` (and a static extent) the block size is a
    tiling decision and the middle loop is always there."""
    extent = loop_extent(sch, loop)
    if sample and extent is not None:
        outer, inner = sch.split(loop, [None, tile])
        blocks = sch.sample_perfect_tile(
            outer, n=2, max_innermost_factor=extent // tile, decision=[extent // block, block // tile])
        return [*sch.split(outer, blocks), inner]
    if block == tile:
        return list(sch.split(loop, [None, tile]))
    return list(sch.split(loop, [None, block // tile, tile]))


def _split_k(sch: s_tir.Schedule, loop: LoopRV, kc: int | None, sample: bool) -> list[LoopRV]:
    """The K loop split into (K blocks, kc); not split when K is symbolic (``kc`` None)."""
    if kc is None:
        return [loop]
    extent = loop_extent(sch, loop)
    if sample and extent is not None:
        return list(sch.split(loop, sch.sample_perfect_tile(
            loop, n=2, max_innermost_factor=extent, decision=[extent // kc, kc])))
    return list(sch.split(loop, [None, kc]))


def _pad_factor(extent: tirx.Expr, padded: int | None, tile: int) -> int:
    """The ``pad_einsum`` factor of one axis: its planned size when static, else its tile
    unless the symbolic extent is proven a multiple of it (1: no padding)."""
    if padded is not None:
        return padded if padded != int(extent.value) else 1
    return 1 if Analyzer().can_prove(tirx.floormod(extent, tile) == 0) else tile


def reads_plainly(block: s_tir.SBlock, buffer: tirx.Buffer) -> bool:
    """Whether ``block`` reads ``buffer`` only at distinct plain iters / constants.

    ``reverse_compute_at`` must invert the consumer's index into the producer's region; for a
    fused index such as ``b * 10 + i`` TVM 0.27 derives too small a loop nest and silently
    skips outputs (seen on a 3-D x 2-D matmul), so the epilogue is only fused in this case.
    """
    for region in block.reads:
        if region.source.same_as(buffer):
            mins = [rng.min for rng in region.region]
            if not all(isinstance(x, (tirx.Var, tirx.IntImm)) for x in mins):
                return False
            names = [x for x in mins if isinstance(x, tirx.Var)]
            return not any(a.same_as(b) for i, a in enumerate(names) for b in names[i + 1 :])
    return False


def _place_epilogue(
    sch: s_tir.Schedule, main: SBlockRV, epilogue: list[SBlockRV], chunk: LoopRV, lanes: int,
    tile: LoopRV | None = None,
) -> bool:
    """Place the epilogue: on each register tile (``tile``) where it can, else once per
    parallel chunk, else as passes of its own.  True where it runs on the tile."""
    result = sch.get(main).writes[0].source
    if len(epilogue) == 1 and not reads_plainly(sch.get(epilogue[0]), result):
        iterate_as_read(sch, epilogue[0], result)
    if len(epilogue) == 1 and reads_plainly(sch.get(epilogue[0]), result):
        for loop in (tile, chunk) if tile is not None else (chunk,):
            try:
                sch.reverse_compute_at(epilogue[0], loop)
            except s_tir.ScheduleError:
                continue
            inner = sch.get_loops(epilogue[0])[-1]
            if splits_into_vectors(sch, inner, lanes):
                sch.vectorize(sch.split(inner, [None, lanes])[1])
            return loop is tile
    for block in epilogue:
        schedule_injective(sch, block, lanes)
    return False


class Gemm(CPUScheduleRule):
    """Default CPU schedule for a (batched, fused) matmul PrimFunc; None when not one.

    ``tunable=True`` returns the tuning design spaces instead (``gemm_spaces``), the
    default plan's first.  The plans' knobs come from ``options`` (the default ones when None).
    """

    def __init__(self, options: CompileOptions | None = None) -> None:
        self.options = options

    def _found(self, func: tirx.PrimFunc, target: Target) -> tuple | None:
        """(schedule, GEMM block, traits, vector role) when ``func`` is this rule's."""
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        try:
            sch = s_tir.Schedule(func)
            main = find_reduction_block(sch)
        except Exception:  # noqa: BLE001 - not a TensorIR function TensorIR can schedule
            return None
        if main is None:
            return None
        try:
            inline_dequantized_operand(sch, main)
        except s_tir.ScheduleError:
            return None
        traits = detect_gemm(sch.get(main))
        if traits is None:
            return None
        if looks_like_convolution(sch.get(main)):
            return None  # Conv2d owns those (it picks the GEMM orientation per shape)
        # on a tie, vectorise the output's innermost axis: the epilogue stores are vectors
        innermost = [r for r in traits.out if r in (IterRole.I, IterRole.J)][-1]
        by_area = gemm_tiles_by_area(target)
        role = choose_vector_role(traits, float32_lanes(target), innermost, by_area)
        return sch, main, traits, role

    def apply(self, func: tirx.PrimFunc, target: Target,
              tunable: bool) -> s_tir.Schedule | list[s_tir.Schedule] | None:
        found = self._found(func, target)
        if found is None:
            return None
        try:
            if tunable:
                return gemm_spaces(*found, target, self.options) or None
            schedule_gemm(*found, target, options=self.options)
        except Exception:  # noqa: BLE001 - ScheduleError / InternalError: not our shape
            return None
        return found[0]

    def choices(self, func: tirx.PrimFunc, target: Target) -> list[tuple[dict, s_tir.Schedule]]:
        """Every candidate plan's schedule of ``func`` with its choice, the default's first
        (``plan_schedules``); empty when ``func`` is not this rule's."""
        found = self._found(func, target)
        try:
            return plan_schedules(*found, target, self.options) if found is not None else []
        except Exception:  # noqa: BLE001 - ScheduleError / InternalError: not our shape
            return []

    def apply_choice(self, func: tirx.PrimFunc, target: Target,
                     choice: Mapping[str, Any]) -> s_tir.Schedule | None:
        """``func`` scheduled by the candidate plan ``choice`` names; None when ``func`` is
        not this rule's, no candidate of it is named so, or that plan does not fit."""
        found = self._found(func, target)
        if found is None:
            return None
        try:
            schedule_gemm(*found, target, choice=choice, options=self.options)
        except Exception:  # noqa: BLE001 - ValueError / ScheduleError: keep the default
            return None
        return found[0]


def looks_like_convolution(block: s_tir.SBlock) -> bool:
    """Whether an operand index is a compound expression (``y*s + r``), as in conv2d."""
    for region in block.reads:
        for rng in region.region:
            if not isinstance(rng.min, (tirx.Var, tirx.IntImm)):
                return True
    return False
