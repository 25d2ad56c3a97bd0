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

A symbolic M (``batch * seq`` rows) is planned from a representative row count: ``mr`` is
the widest register tile (no divisor to prefer), M is padded to a multiple of ``mr`` at run
time, and ``mc == mr``, so the M loop is exactly ``ceil(M / mr)`` strips and no block
predicate reaches the micro-kernel (a predicate there keeps LLVM from holding the C tile in
registers). N and K stay static: the vector axis is never predicated.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GemmPlan:
    """Tiling of one GEMM; all padded extents are multiples of their tiles."""

    mr: int
    nr: int
    lanes: int
    m_padded: int
    n_padded: int
    k_padded: int
    mc: int
    nc: int
    kc: int
    parallel_m: bool
    pack_b: bool


# Rows assumed when choosing mr for a symbolic M: enough for the widest register tile.
SYMBOLIC_ROWS = 64


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
    batch: int,
    m: int,
    n: int,
    k: int,
    lanes: int,
    cores: int,
    registers: int = 32,
    b_contiguous_in_n: bool = False,
    b_im2col: bool = False,
    m_symbolic: bool = False,
) -> GemmPlan:
    """Tile sizes for ``C[batch, m, n] += A[batch, m, k] * B[batch, n, k]``.

    ``b_contiguous_in_n`` says B's source is stored with N innermost: then a small-M GEMM
    reads it in place instead of packing (packing costs as much as the math when M is tiny).
    With ``m_symbolic``, ``m`` is a representative row count and ``m_padded`` is planned
    for it only (the kernel pads the real M to a multiple of ``mr``).
    """
    nr = _choose_nr(n, lanes, registers)
    mr = _choose_mr(SYMBOLIC_ROWS if m_symbolic else m, nr, lanes, registers)
    m_padded, n_padded = _ceil_to(m, mr), _ceil_to(n, nr)
    k_padded, kc = _choose_kc(k)
    mc = mr if m_symbolic else _largest_divisor_multiple(m_padded, mr, max(96, mr))
    nc = _largest_divisor_multiple(n_padded, nr, 512)
    if batch * (n_padded // nc) < cores:
        nc = _largest_divisor_multiple(n_padded, nr, max(nr, n_padded // cores))
    parallel_m = batch * (n_padded // nc) < cores and m_padded // mc > 1
    # an im2col B is already stored [S, K, N]: packing it again would copy it twice
    pack_b = not b_im2col and not (b_contiguous_in_n and not m_symbolic and m <= 2 * mr)
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
