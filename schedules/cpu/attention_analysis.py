"""What the Attention rule recognizes and how it tiles it (pure analysis, no scheduling).

``find_attention``: the PrimFunc's blocks, once its views are inlined, are a batched matmul
``S[b, i, j] += Q[b, i, k] * Kt[b, k, j]`` (q·kᵀ), row-wise blocks over ``(b, i)``, and a
batched matmul ``O[b, i, d] += P[b, i, j] * V[b, j, d]`` (p·v) whose P is computed from S
and whose V is not; the matmuls are the function's only two multiply-accumulate blocks.

``plan_attention``: rows per tile and register tiles from the problem's extents.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.schedule import SBlockRV

from .common import is_one, largest_pow2_divisor
from .gemm_analysis import is_multiply_accumulate

# Query rows per tile, at most: with 32 vector registers (AVX-512) 8 rows x 2 key vectors,
# or 8 rows x 2 head vectors, is a 16-vector register tile (on ViT-B/16 and GPT-2, tiles of
# 4 and 6 rows ran slower).  The accumulators take half the registers, so with 16 (AVX2)
# a tile 2 key vectors wide has 4 rows (``plan_attention``): 8 rows x 1 vector loads 9
# values per 8 FMAs where 4 x 2 loads 6; on a 2-core Zen 3 Whisper's 1500 x 1500 heads
# ran in 0.73-0.90 of the time (6 x 2, 12 accumulators: 0.75-0.79), the same bits.
MAX_ROWS = 8


@dataclass(frozen=True)
class AttentionPlan:
    """Tile sizes: ``rows`` query rows per tile, ``key_vectors`` vectors of keys per q·kᵀ
    register tile, the head dimension in vectors of ``head_lanes`` lanes, those vectors in
    ``head_splits`` parts (one p·v register tile each)."""

    rows: int
    key_vectors: int
    lanes: int
    head_lanes: int
    head_splits: int

    @property
    def key_width(self) -> int:
        """The keys of a q·kᵀ register tile."""
        return self.key_vectors * self.lanes

    def part_vectors(self, head: int) -> int:
        """The head-dimension vectors of one p·v register tile, for a head dimension ``head``."""
        return head // self.head_lanes // self.head_splits


# With 16 vector registers (AVX2) the tiles hold 12 accumulators: q·kᵀ's 6 rows x 2 key
# vectors beside its 2 kᵀ vectors and the broadcast q value, p·v's 6 rows x 2 head vectors
# beside 2 v vectors and the broadcast p value.  On a 2-core Zen 3, Whisper's 6 heads of
# 1500 x 1500 x 64 alone ran in 0.95-0.99x the 4-row tiles' time (8 accumulators: two
# 4-cycle FMA pipes and nothing to spare), the same bits.  With 32 (AVX-512) half the
# registers: 6-row tiles with 24 accumulators ran slower there.
FULL_TILE_SPARE = 4


def plan_attention(m: int | None, n: int | None, d: int | None, lanes: int,
                   registers: int = 32, full_tile: bool = True) -> AttentionPlan:
    """Tile sizes for ``m`` query rows, ``n`` keys and head dimension ``d`` (None: symbolic).

    Accumulators stay within half the ``registers`` vector registers (32 with AVX-512), or
    with 16 (AVX2) and ``full_tile`` all but ``FULL_TILE_SPARE`` of them.
    """
    budget = registers - FULL_TILE_SPARE if full_tile and registers <= 16 else registers // 2
    key_vectors = 2
    if n is not None and _ceil(n, 2 * lanes) - _ceil(n, lanes) > n / 8:
        key_vectors = 1  # a short key row would be mostly padding
    rows = _tile_rows(m, min(MAX_ROWS, budget // key_vectors))
    head_lanes = largest_pow2_divisor(d, lanes) if d is not None else 1
    vectors = d // head_lanes if d is not None else 1
    splits = next(s for s in range(1, vectors + 1)
                  if vectors % s == 0 and rows * vectors // s <= budget)
    return AttentionPlan(rows, key_vectors, lanes, head_lanes, splits)


# Fewer rows per tile only when they save more than this share of the padded rows (Swin's
# 49-token windows: 7 rows pad nothing where 8 pad to 56).
ROW_PADDING_SAVED = 1 / 16


def _tile_rows(m: int | None, most: int) -> int:
    """``most`` rows, or one or two fewer when that pads ``m`` rows to fewer by a real margin."""
    if m is None:
        return most
    if m <= most:
        return m
    best = min(range(most, max(most - 3, 0), -1), key=lambda r: _ceil(m, r))
    return best if _ceil(m, most) - _ceil(m, best) > m * ROW_PADDING_SAVED else most


def _ceil(value: int, factor: int) -> int:
    return -(-value // factor) * factor


@dataclass(frozen=True)
class AttentionBlocks:
    """The two matmul blocks of an attention PrimFunc."""

    qk: SBlockRV
    pv: SBlockRV


def _is_batched_matmul(block: s_tir.SBlock) -> bool:
    """``C[*b, i, j] += A[*b, i, k] * B[*b, k, j]`` with plain indices: the iters are the
    batch axes, then i, j (spatial) and k (reduction)."""
    if not is_multiply_accumulate(block) or len(block.reads) != 2 or len(block.iter_vars) < 3:
        return False
    *batch, i, j, k = block.iter_vars
    kinds = [iv.iter_type for iv in block.iter_vars]
    if kinds[-1] != tirx.IterVar.CommReduce or any(kd != tirx.IterVar.DataPar for kd in kinds[:-1]):
        return False
    expected = [(*batch, i, k), (*batch, k, j), (*batch, i, j)]
    regions = [block.reads[0].region, block.reads[1].region, block.writes[0].region]
    return all(_indexes(region, axes) for region, axes in zip(regions, expected))


def _indexes(region, axes: tuple[tirx.IterVar, ...]) -> bool:
    """Whether ``region`` is the point ``axes`` (trailing axes; leading ones constant), an
    axis of extent 1 possibly read at 0 (``StmtSimplify`` folds its iter away)."""
    mins = [rng.min for rng in region]
    if len(mins) < len(axes):
        return False
    lead, tail = mins[: len(mins) - len(axes)], mins[len(mins) - len(axes):]
    return all(isinstance(x, tirx.IntImm) for x in lead) and all(
        (isinstance(x, tirx.Var) and x.same_as(iv.var)) or (_is_zero(x) and is_one(iv.dom.extent))
        for x, iv in zip(tail, axes)
    )


def _is_zero(expr: tirx.Expr) -> bool:
    return isinstance(expr, tirx.IntImm) and expr.value == 0


def count_matmuls(func: tirx.PrimFunc) -> int:
    """How many multiply-accumulate blocks ``func`` has (without building a schedule)."""
    found = []
    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, lambda b: found.append(is_multiply_accumulate(b)))])
    return sum(found)


def find_attention(sch: s_tir.Schedule) -> AttentionBlocks | None:
    """The q·kᵀ and p·v blocks when the function is attention-shaped (module docstring)."""
    root = get_root_block(sch)
    if root is None:
        return None
    children = sch.get_child_blocks(root)
    macs = [b for b in children if is_multiply_accumulate(sch.get(b))]
    if len(macs) != 2 or not all(_is_batched_matmul(sch.get(b)) for b in macs):
        return None
    qk, pv = macs
    if not _reaches(sch, qk, sch.get(pv).reads[0].source):
        return None  # p·v's left operand is not computed from q·kᵀ
    if _reaches(sch, qk, sch.get(pv).reads[1].source):
        return None  # nor may its right operand be
    return AttentionBlocks(qk, pv)


def _reaches(sch: s_tir.Schedule, block: SBlockRV, buffer: tirx.Buffer) -> bool:
    """Whether ``buffer`` is computed (transitively) from what ``block`` writes."""
    frontier, seen = [block], set()
    while frontier:
        current = frontier.pop()
        if any(w.source.same_as(buffer) for w in sch.get(current).writes):
            return True
        for consumer in sch.get_consumers(current):
            name = sch.get(consumer).name_hint
            if name not in seen:
                seen.add(name)
                frontier.append(consumer)
    return False
