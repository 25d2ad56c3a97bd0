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
  gives fewer chunks than cores the M blocks become parallel too (``parallel_m``).

The numbers were measured on the 2-core AVX-512 host (1024^3 single-threaded: mr=4..6,
nr=64, kc=256 ran at 88-97% of OpenBLAS; kc=128 or nr=32 lost 10-20%). mr prefers a divisor
of M in [max/2, max]: padding M costs a copy of A (for a conv, a second im2col pass).

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
"""

from __future__ import annotations

from dataclasses import dataclass


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


def _choose_nr(n: int, lanes: int, registers: int) -> int:
    widest = 4 if registers >= 32 else 2
    candidates = [v * lanes for v in range(widest, 0, -1)]
    # least padding first, then the widest tile (fewer B loads per FMA)
    return min(candidates, key=lambda nr: (_ceil_to(n, nr), -nr))


def _choose_mr(m: int, nr: int, lanes: int, registers: int) -> int:
    # accumulators + B vectors + one broadcast must fit, with a little slack
    max_mr = max(1, (registers - nr // lanes - 2) // (nr // lanes))
    max_mr = min(max_mr, 6 if nr >= 4 * lanes else 8 if nr >= 3 * lanes else 14)
    if m <= max_mr:
        return m
    # a divisor of m avoids padding A (for im2col that is a second copy of it)
    low = max(1, (max_mr + 1) // 2)
    return min(range(low, max_mr + 1), key=lambda mr: (_ceil_to(m, mr), -mr))


def _choose_kc(k: int) -> tuple[int, int]:
    """(padded K, kc): kc divides the padded K and sits near 256."""
    if k <= 384:
        return k, k
    divisors = [d for d in range(96, 385) if k % d == 0]
    if divisors:
        return k, min(divisors, key=lambda d: abs(d - 256))
    padded = _ceil_to(k, 128)  # 128 always divides it
    return padded, min(
        (d for d in range(128, 385, 64) if padded % d == 0), key=lambda d: abs(d - 256)
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
) -> GemmPlan:
    """Tile sizes for ``C[batch, m, n] += A[batch, m, k] * B[batch, n, k]``; None is symbolic.

    ``b_contiguous_in_n`` says B's source is stored with N innermost: then a small-M GEMM
    reads it in place instead of packing (packing costs as much as the math when M is tiny).
    A symbolic extent has no padded size here (the kernel pads it at run time).
    """
    nr = 2 * lanes if n is None else _choose_nr(n, lanes, registers)
    mr = _choose_mr(SYMBOLIC_ROWS if m is None else m, nr, lanes, registers)
    m_padded = None if m is None else _ceil_to(m, mr)
    n_padded = None if n is None else _ceil_to(n, nr)
    k_padded, kc = (None, None) if k is None else _choose_kc(k)
    mc = max(mr, SYMBOLIC_MC // mr * mr) if m_padded is None else _largest_divisor_multiple(m_padded, mr, max(96, mr))
    if n_padded is None:
        nc, parallel_m = nr, True
    else:
        nc = _largest_divisor_multiple(n_padded, nr, 512)
        chunks = (batch or 1) * (n_padded // nc)
        if chunks < cores:
            nc = _largest_divisor_multiple(n_padded, nr, max(nr, n_padded // cores))
        chunks = (batch or 1) * (n_padded // nc)
        parallel_m = chunks < cores and (m_padded is None or m_padded // mc > 1)
    if parallel_m and m_padded is None:
        mc = mr  # the strips are the parallel loop: one per iteration
    # an im2col B is already stored [S, K, N]: packing it again would copy it twice; a
    # B of exactly one N panel read in place is already in the packed layout
    small_m = m is not None and m <= 2 * mr
    pack_b = not b_im2col and not (b_contiguous_in_n and (small_m or n_padded == nr))
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
    )
