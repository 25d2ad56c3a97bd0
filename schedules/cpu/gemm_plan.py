"""Tile sizes for the CPU GEMM kernel, chosen from the problem shape (a pure function).

The kernel (see ``gemm.py``) is the BLIS loop nest on ``C[S, M, N] += A[S, M, K] * B[S, N, K]``
with B packed as ``[S, N/nr, K, nr]``:

    S, N/nc (parallel) -> K/kc -> M/mc -> nc/nr -> mc/mr -> kc -> mr (unrolled) x nr (vector)

* ``mr x nr`` is the register tile: ``mr * nr / lanes`` accumulators plus ``nr / lanes``
  B vectors and one broadcast A value must fit the 32 (AVX-512) / 16 (AVX2) vector registers.
* ``kc`` keeps a ``kc x nr`` packed B micro-panel in L1 (256 x 64 floats = 64 KiB streams
  well from a 48 KiB L1 plus L2 on this machine); C stays in memory between ``kc`` blocks
  and LLVM promotes the tile to registers inside the ``kc`` loop.
* ``nc`` is the per-thread column block: the parallel loop runs over ``S x N/nc``; when that
  gives fewer chunks than cores, or chunks that fill the cores' rounds less evenly than
  ``S x N/nc x M/mc`` would (3 column blocks on 2 cores), the M blocks become parallel too
  (``parallel_m``; ``CompileOptions.gemm_rows_for_balance``).

The numbers were measured on an AVX-512 host against OpenBLAS (1024^3 single-threaded:
mr=4..6, nr=64, kc=256 came closest to it; kc=128 or nr=32 fell further behind). mr prefers
a divisor of M in [max/2, max]: padding M costs a copy of A (for a conv, a second im2col
pass).

Symbolic extents (``batch * seq`` rows, an attention's key length) are padded at run time
to whole tiles, so no predicate reaches a micro-kernel of whole tiles (a predicate there
keeps LLVM from holding the C tile in registers and the vector loop from being one vector
op):

* M: ``mr`` is the widest register tile (no divisor to prefer), padded to a multiple of
  ``mr``; the strips are blocked by ``SYMBOLIC_MC`` rows as a static M is (a B panel
  serves a block of strips from L1, not one strip), the strips past M in the last block
  split off at lowering (``gemm._split_strips``), except when the M strips are the
  parallel loop (then ``mc == mr``);
* N: ``nr`` is two vectors (a key length pads by at most 31 columns), ``nc == nr``,
  and the M strips run in parallel;
* K: not blocked and not padded (``kc`` is all of K: the K loop is the reduction itself,
  and an attention's K is at most a few hundred).

``plan_candidates`` is the tuning space around that plan (``aicf tune``): the default plan
first, then its neighbours (``mr`` near the rule's pick and the widest that fits, the other
parallel split and packing choice, ``nr`` of 1..4 vectors).  The
block sizes ``mc``, ``nc``, ``kc`` are not enumerated here: the tunable schedule samples
them (``gemm.tile_gemm``), with this plan's values as the starting decision.  A kernel with
symbolic extents is tuned in these plans alone (``schedules.tuning.symbolic``): a plan is
named by ``plan_choice`` (the fields the candidates vary), which ``aicf_tuning.json``
stores and ``compile`` looks up among the candidates again (``chosen_plan``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aicf_tvm.core.options import CompileOptions, options_or_default


@dataclass(frozen=True)
class GemmPlan:
    """Tiling of one GEMM; all padded extents are multiples of their tiles.

    A symbolic extent has no padded size (None); a symbolic K is not blocked (``kc`` None).
    """

    mr: int
    nr: int
    lanes: int
    m_padded: int | None
    n_padded: int | None
    k_padded: int | None
    mc: int
    nc: int
    kc: int | None
    parallel_m: bool
    pack_b: bool
    # B panels of nr columns one register tile spans (``_row_panels``): the tile is
    # mr x (panels x nr), B still packed nr columns a panel
    panels: int = 1


# Rows assumed when choosing mr for a symbolic M: enough for the widest register tile.
SYMBOLIC_ROWS = 64
# Rows of an M block when M is symbolic (a static M takes a divisor of it up to 96).
SYMBOLIC_MC = 96


def _ceil_to(value: int, factor: int) -> int:
    return -(-value // factor) * factor


def _largest_divisor_multiple(total: int, unit: int, limit: int) -> int:
    """Largest multiple of ``unit`` that divides ``total`` (a multiple of unit) and is <= limit."""
    best = unit
    for count in range(1, total // unit + 1):
        size = count * unit
        if size > limit:
            break
        if total % size == 0:
            best = size
    return best


def _widest_vectors(registers: int) -> int:
    """The most vectors a register tile's row may span: 4 of 32 registers, 2 of 16."""
    return 4 if registers >= 32 else 2


def _choose_nr(n: int, lanes: int, registers: int) -> int:
    candidates = [v * lanes for v in range(_widest_vectors(registers), 0, -1)]
    # least padding first, then the widest tile (fewer B loads per FMA)
    return min(candidates, key=lambda nr: (_ceil_to(n, nr), -nr))


def _max_mr(nr: int, lanes: int, registers: int) -> int:
    """The most rows of an ``nr``-wide register tile: accumulators + B vectors + one
    broadcast must fit, with a little slack."""
    max_mr = max(1, (registers - nr // lanes - 2) // (nr // lanes))
    return min(max_mr, 6 if nr >= 4 * lanes else 8 if nr >= 3 * lanes else 14)


def _choose_mr(m: int, nr: int, lanes: int, registers: int) -> int:
    return _rows_within(m, _max_mr(nr, lanes, registers))


def _rows_within(m: int, max_mr: int) -> int:
    """The tile's rows, at most ``max_mr``: all of a small M, else those padding M least,
    then the most."""
    if m <= max_mr:
        return m
    # a divisor of m avoids padding A (for im2col that is a second copy of it)
    low = max(1, (max_mr + 1) // 2)
    return min(range(low, max_mr + 1), key=lambda mr: (_ceil_to(m, mr), -mr))


# CompileOptions.gemm_area_slack: how much more padded work (M x N, padded) the by-area
# rule accepts for a tile with more accumulators: on an Intel Xeon the 8 x 3-vector
# tile beat 4 x 4 on 128 x 2816 (0.6% padding), by less on 128 x 1024 (3%), and tied on
# 128 x 256 (12.5%).


def _area_tiles(m: int, n: int, lanes: int, registers: int) -> dict[tuple[int, int], int]:
    """``{(nr, mr): padded M x N}`` of the tiles 1..4 vectors wide, each with its
    rule-chosen ``mr``."""
    tiles = [(v * lanes, _choose_mr(m, v * lanes, lanes, registers))
             for v in range(_widest_vectors(registers), 0, -1)]
    return {t: _ceil_to(m, t[1]) * _ceil_to(n, t[0]) for t in tiles}


def least_padded_area(m: int, n: int, lanes: int, registers: int = 32) -> int:
    """The least padded M x N of the by-area rule's candidate tiles."""
    return min(_area_tiles(m, n, lanes, registers).values())


def _tile_by_area(m: int, n: int, lanes: int, registers: int, slack: float) -> tuple[int, int]:
    """``(nr, mr)``: of the tiles 1..4 vectors wide, each with its rule-chosen ``mr``,
    those padding ``M x N`` at most ``slack`` times the least, and of them the one
    with the most accumulators (``mr x nr``), then the least padding.  For 128 rows by
    768, 1024, 2816 or 3072 columns that is 8 rows x 3 vectors (24 accumulators), where
    widest-first gives 4 x 4 (16): ``mr`` 6 does not divide 128."""
    area = _area_tiles(m, n, lanes, registers)
    least = min(area.values())
    return max((t for t in area if area[t] <= least * slack), key=lambda t: (t[0] * t[1], -area[t]))


# Rows above which a static M has several row blocks (``mc`` at most 96), so no B panel
# prefetch (``gemm_prefetch.prefetch_pays`` on 16 registers) shares the registers.
FULL_TILE_MIN_ROWS = 96


def _full_register_tile(m: int, n: int, lanes: int, registers: int, slack: float) -> tuple[int, int]:
    """``(nr, mr)`` of a 16-register target (AVX2) for a GEMM whose M has several row
    blocks: the rule's tile (``_choose_nr``, ``_choose_mr``) unless it holds fewer
    accumulators than one filling the registers, 4 rows x 3 vectors (12 accumulators, 3 B
    vectors and the broadcast: all 16), padding ``M x N`` at most ``slack`` times the
    rule's.  128 rows take it where the rule's 2-vector tile has 4 rows (6 would pad M to
    132): 8 accumulators, FMAs waiting on their latency.  197 rows keep 6 x 2 (12 already;
    3 vectors would hold 3 rows), 1500 rows too.  Where K is one block the epilogue runs on
    the tile (``gemm._tile_loop``): with no math call in it the full tile ran Swin's
    196 x 384 -> 1152, 3136 x 96 -> 288, 784 x 192 -> 576 and 3136 x 384 -> 96 in
    0.80-0.89x the time (AMD Zen 3, standalone, the same bits), but a GELU's constants
    spilled its accumulators in the K loop (196 x 384 -> 1536: 1.69-1.85x), so a math
    epilogue keeps the rule's tile there (``plan_gemm``'s ``epilogue_math``).

    Measured where it is not used: with one row block the B panel's prefetch spilled
    (96 x 896 -> 1152: 1.85x); where 6 x 2 holds 12 it was no faster."""
    nr = _choose_nr(n, lanes, registers)
    mr = _choose_mr(m, nr, lanes, registers)
    vectors = (registers - 1) // 5  # at least 4 rows: 5 registers a vector (16: 3 vectors)
    full_mr = _rows_within(m, (registers - vectors - 1) // vectors)
    full = (vectors * lanes, full_mr)
    if full_mr * vectors <= mr * (nr // lanes):
        return nr, mr
    if _ceil_to(m, full_mr) * _ceil_to(n, full[0]) > slack * _ceil_to(m, mr) * _ceil_to(n, nr):
        return nr, mr
    return full


# kc near 128 with the by-area tile (Intel AVX-512, CompileOptions.gemm_kc_near_by_area):
# a 48-column B panel is then 24 KiB, half the 48 KiB L1 beside the A strip.  On an Intel
# Xeon, in one process, BERT, ViT and GPT-2 ran faster than with kc near 256, LLaMA as
# fast, the same bits.
KC_NEAR = 256


NC_MAX = 512  # columns of a thread's block of B: nc x kc floats stay within L2


def _balance(chunks: int, cores: int) -> float:
    """The share of the cores' time the parallel loop keeps busy: ``chunks`` equal chunks
    run in rounds of ``cores``, the last round partly idle."""
    return chunks / _ceil_to(chunks, cores)


def _choose_nc(n_padded: int, nr: int, batch: int, cores: int) -> int:
    """The per-thread column block: a multiple of ``nr`` dividing the padded N, at most
    ``NC_MAX``, that splits ``batch x N/nc`` chunks most evenly over the cores, then the
    widest.  Widest alone gave 1536 columns 3 chunks of 512 (one core idle a third of the
    time) and 2816 columns 11 chunks of 256; on an AMD EPYC (Zen 4) the even split
    ran the LLaMA decoder of ``scripts/bench_peers.py`` faster (also with its q/k/v
    projections combined, ``relax_passes.CombineProjections``), the same bits."""
    sizes = [nr * count for count in range(1, n_padded // nr + 1)
             if n_padded % (nr * count) == 0 and nr * count <= max(nr, NC_MAX)]
    return max(sizes, key=lambda size: (_balance(batch * (n_padded // size), cores), size))


def _widest_nc(n_padded: int, nr: int, batch: int, cores: int) -> int:
    """The column block before the even split (``CompileOptions.gemm_even_column_blocks``
    False): the widest, narrowed only below one chunk a core."""
    nc = _largest_divisor_multiple(n_padded, nr, NC_MAX)
    if batch * (n_padded // nc) < cores:
        nc = _largest_divisor_multiple(n_padded, nr, max(nr, n_padded // cores))
    return nc


def _choose_kc(k: int, near: int = KC_NEAR) -> tuple[int, int]:
    """(padded K, kc): kc divides the padded K and sits near ``near``."""
    if k <= 384:
        return k, k
    divisors = [d for d in range(96, 385) if k % d == 0]
    if divisors:
        return k, min(divisors, key=lambda d: abs(d - near))
    padded = _ceil_to(k, 128)  # 128 always divides it
    return padded, min(
        (d for d in range(128, 385, 64) if padded % d == 0), key=lambda d: abs(d - near)
    )


def plan_gemm(
    batch: int | None,
    m: int | None,
    n: int | None,
    k: int | None,
    lanes: int,
    cores: int,
    registers: int = 32,
    b_contiguous_in_n: bool = False,
    b_im2col: bool = False,
    tile_by_area: bool = False,
    options: CompileOptions | None = None,
    b_constant: bool = False,
    epilogue_math: bool = False,
    *,
    nr: int | None = None,
    mr: int | None = None,
    pack_b: bool | None = None,
    parallel_m: bool | None = None,
) -> GemmPlan:
    """Tile sizes for ``C[batch, m, n] += A[batch, m, k] * B[batch, n, k]``; None is symbolic.

    ``b_contiguous_in_n`` says B's source is stored with N innermost: then a small-M GEMM
    reads it in place instead of packing (packing costs as much as the math when M is tiny).
    A symbolic extent has no padded size here (the kernel pads it at run time).
    ``tile_by_area`` chooses the register tile of a static M and N by ``_tile_by_area``
    instead of the widest ``nr`` first (``common.gemm_tiles_by_area``: the target's cores),
    and ``kc`` near ``options.gemm_kc_near_by_area`` (with or without ``nr`` and ``mr`` given);
    ``options`` (the default ones when None) also decide the area slack and the column block.
    ``b_constant``: B is a weight packed once at compile time (``prepack_weights``), so a
    small M reads it packed too (``_packs_b``).  ``epilogue_math``: the epilogue calls a
    math function (GELU's erf): no full register tile where K is one block
    (``_full_register_tile``).
    ``nr``, ``mr``, ``pack_b`` and ``parallel_m`` override the rule's choice (tuning); the
    other sizes follow from them by the same rules.
    """
    options = options_or_default(options)
    tile_by_area = tile_by_area and m is not None and n is not None and m > _one_strip(lanes, registers)
    if tile_by_area and nr is None and mr is None:
        nr, mr = _tile_by_area(m, n, lanes, registers, options.gemm_area_slack)
    elif (options.gemm_full_register_tile and registers < 32 and nr is None and mr is None and m is not None
          and n is not None and k is not None and m > FULL_TILE_MIN_ROWS
          and (_choose_kc(k)[1] < k or not epilogue_math)):
        nr, mr = _full_register_tile(m, n, lanes, registers, options.gemm_area_slack)
    if nr is None:
        nr = 2 * lanes if n is None else _choose_nr(n, lanes, registers)
    if mr is None:
        mr = _choose_mr(SYMBOLIC_ROWS if m is None else m, nr, lanes, registers)
    m_padded = None if m is None else _ceil_to(m, mr)
    n_padded = None if n is None else _ceil_to(n, nr)
    k_padded, kc = (None, None) if k is None else _choose_kc(k, options.gemm_kc_near_by_area if tile_by_area
                                                             else KC_NEAR)
    mc = max(mr, SYMBOLIC_MC // mr * mr) if m_padded is None else _largest_divisor_multiple(m_padded, mr, max(96, mr))
    panels = _row_panels(mr, nr, lanes, registers, n_padded, options)
    if n_padded is None:
        nc, parallel = nr, True
    else:
        choose_nc = _choose_nc if options.gemm_even_column_blocks else _widest_nc
        nc = choose_nc(n_padded, nr * panels, batch or 1, cores)
        chunks = (batch or 1) * (n_padded // nc)
        row_blocks = None if m_padded is None else m_padded // mc
        parallel = chunks < cores and (row_blocks is None or row_blocks > 1)
        if (options.gemm_rows_for_balance and not parallel and row_blocks is not None
                and _balance(chunks * row_blocks, cores) > _balance(chunks, cores)):
            parallel = True  # column blocks alone leave a core idle part of the time
    parallel_m = parallel if parallel_m is None else parallel_m
    if parallel_m and m_padded is None:
        mc = mr  # the strips are the parallel loop: one per iteration
    if pack_b is None:
        pack_b = _packs_b(m, mr, nr, n_padded, b_contiguous_in_n, b_im2col, b_constant)
    return GemmPlan(
        mr=mr,
        nr=nr,
        lanes=lanes,
        m_padded=m_padded,
        n_padded=n_padded,
        k_padded=k_padded,
        mc=mc,
        nc=nc,
        kc=kc,
        parallel_m=parallel_m,
        pack_b=pack_b,
        panels=panels,
    )


# Independent sums a register tile needs to keep the FMA units busy: the FMA's latency (4
# cycles on Zen 3, Skylake and later) times the FMAs issued a cycle (2).
FMA_CHAINS = 8


def _row_panels(mr: int, nr: int, lanes: int, registers: int, n_padded: int | None,
                options: CompileOptions) -> int:
    """How many B panels of ``nr`` columns one register tile spans: where the tile's
    ``mr x nr / lanes`` sums are fewer than ``FMA_CHAINS`` (a decode step's one row x 2
    vectors on AVX2: two chains, each FMA waiting on the last), the tile takes as many
    panels side by side as bring the sums to ``FMA_CHAINS``, within the registers, dividing
    the padded N (the column block is then a multiple of the tile); the weight keeps its
    packing (``compile_causal_lm``'s prompt and decode functions share it) and each output
    its order of additions (the same bits).

    On 16-register targets only (AVX2; ``CompileOptions.gemm_row_panels``): measured on
    Zen 3, the 110M LLaMA's int8-weight decode step (1 row x 2 vectors, K in blocks of
    256) ran ~1.1-1.2x as many tokens a second with 4 panels; AVX-512's one-row tile (4
    vectors) was not measured with more."""
    if not options.gemm_row_panels or registers >= 32 or n_padded is None:
        return 1
    vectors = max(1, nr // lanes)
    panels = 1
    # the sums, one panel's B vectors and the broadcast of A fit the registers
    while (mr * vectors * panels * 2 <= FMA_CHAINS and n_padded % (nr * panels * 2) == 0
           and mr * vectors * panels * 2 + vectors + 1 <= registers):
        panels *= 2
    return panels


def _one_strip(lanes: int, registers: int) -> int:
    """The most rows one strip of the widest register tile holds: a static M up to it is
    one strip whatever the tile, so every tile holds M x nr accumulators and the by-area
    rule has nothing to trade; such an M (a decode step's one row) takes the same ``nr``
    as a symbolic M, and a weight both pack is packed alike (``compile_causal_lm``'s
    functions share it)."""
    return _max_mr(_widest_vectors(registers) * lanes, lanes, registers)


def _packs_b(m: int | None, mr: int, nr: int, n_padded: int | None, b_contiguous_in_n: bool,
             b_im2col: bool, b_constant: bool) -> bool:
    """Whether B is copied into the packed layout.  Never an im2col B (already stored
    [S, K, N]: packing it would copy it twice), nor a B of exactly one N panel stored
    N-innermost (already the packed layout).  A B stored N-innermost is read in place by a
    small M (packing per call costs as much as the math), unless it is a constant packed
    once at compile time: then the packed panels stream contiguously where the rows of B
    jump a row of N apart (a decode step's matrix-vector products ran ~12% faster, the
    same bits)."""
    if b_im2col or (b_contiguous_in_n and n_padded == nr):
        return False
    small_m = m is not None and m <= 2 * mr
    return not (b_contiguous_in_n and small_m and not b_constant)


def plan_candidates(
    batch: int | None,
    m: int | None,
    n: int | None,
    k: int | None,
    lanes: int,
    cores: int,
    registers: int = 32,
    b_contiguous_in_n: bool = False,
    b_im2col: bool = False,
    tile_by_area: bool = False,
    options: CompileOptions | None = None,
    b_constant: bool = False,
    epilogue_math: bool = False,
) -> list[GemmPlan]:
    """The default plan, then its neighbours, nearest first: ``mr`` one row either side
    and the widest ``mr`` of the default ``nr``; the other parallel split and the other
    packing choice on the default tile; every other ``nr`` with its rule-chosen and its
    widest ``mr``.  Packing is only dropped for a B stored with N innermost (read in place
    it is then a vector load per row) and never added for an im2col B."""
    args = (batch, m, n, k, lanes, cores, registers, b_contiguous_in_n, b_im2col, tile_by_area, options,
            b_constant, epilogue_math)
    default = plan_gemm(*args)
    rows = SYMBOLIC_ROWS if m is None else m

    def tiles(nr: int, mrs: list[int]) -> list[GemmPlan]:
        widest = _max_mr(nr, lanes, registers)
        return [plan_gemm(*args, nr=nr, mr=mr) for mr in [*mrs, widest] if 1 <= mr <= widest]

    plans = [default, *tiles(default.nr, [default.mr - 1, default.mr + 1])]
    tile = {"nr": default.nr, "mr": default.mr}
    plans.append(plan_gemm(*args, **tile, parallel_m=not default.parallel_m))
    if b_contiguous_in_n and not b_im2col:
        plans.append(plan_gemm(*args, **tile, pack_b=not default.pack_b))
    for vectors in range(_widest_vectors(registers), 0, -1):
        if vectors * lanes != default.nr:
            plans += tiles(vectors * lanes, [_choose_mr(rows, vectors * lanes, lanes, registers)])
    return list(dict.fromkeys(plans))


CHOICE_FIELDS = ("mr", "nr", "pack_b", "parallel_m")  # what plan_candidates varies


def plan_choice(plan: GemmPlan) -> dict[str, Any]:
    """The fields that tell ``plan`` from the other candidates (JSON-able)."""
    return {name: getattr(plan, name) for name in CHOICE_FIELDS}


def chosen_plan(choice: Mapping[str, Any], *args: Any) -> GemmPlan | None:
    """The candidate of ``plan_candidates(*args)`` that ``choice`` names; None when none
    does (the choice was made for another problem or target, or edited)."""
    for plan in plan_candidates(*args):
        if plan_choice(plan) == dict(choice):
            return plan
    return None
