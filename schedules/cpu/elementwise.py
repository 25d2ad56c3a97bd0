"""CPU rule for injective PrimFuncs: elementwise chains, broadcast, transpose, reshape
copies, concat, strided_slice, take, pad.

Accepts a PrimFunc when ``NormalizePrimFunc`` succeeds and every block is spatial only
('S' iterators).  Producers are inlined into consumers (``compute_inline`` /
``reverse_compute_inline``; TensorIR refuses an illegal inline with a ``ScheduleError``,
so what stays is left materialized; any other error ends the rule, since it may leave
the schedule half-rewritten; a block storing an immediate is never inlined across, see
``schedules.constants``).  Each remaining block gets its loops fused into one, split
into a parallel outer loop and a vectorized inner loop of one SIMD register.  The inner loop never crosses
a row of the output unless the row length is a multiple of the vector, so the vector
indices stay affine.  With symbolic extents the loops are not fused into one: the
innermost loop is vectorized (a symbolic one with its tail split off at lowering,
``split_vector_tail``) and the outer loops fused into the parallel loop.  Rejected (None): any reduction block, a non-LLVM target, or a
function TensorIR cannot normalize.
"""

import math

import tvm_ffi
from tvm import ir, s_tir, tirx
from tvm.s_tir.dlight.analysis import SBlockInfo, normalize_prim_func
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.target import Target
from tvm.sym.analyzer import Analyzer
from tvm.target.codegen import llvm_get_vector_width

from ..constants import inlines_a_constant
from .fallback import (
    MIN_PARALLEL_WORK,
    LoopRV,
    SBlockRV,
    is_cpu_target,
    loop_extent,
    try_parallel,
)
from .vector_math import expands

# Vectorize only loops with at least this many iterations.
MIN_VECTOR_EXTENT = 4


# Calls LLVM expands into one libm call per lane on x86 (there is no vector math library
# in the TVM build): vectorizing a block that makes them only adds lane shuffles, which
# measured 10-20% slower than the scalar loop for exp.  The float32 ones ``VectorizeMath``
# expands into arithmetic after scheduling (``vector_math.expands``) do not count.
SCALAR_MATH_OPS = frozenset(
    f"tirx.{name}"
    for name in (
        "exp", "exp2", "exp10", "expm1", "log", "log2", "log10", "log1p", "erf", "tanh",
        "sigmoid", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh",
        "pow", "fmod",
    )
)  # fmt: skip


def calls_scalar_math(block: s_tir.SBlock) -> bool:
    """Whether the block's body calls a math function that stays a libm call per lane."""
    scalar = []
    tvm_ffi.structural_walk(
        block.body,
        [(ir.Call, lambda call: scalar.append(
            getattr(call.op, "name", "") in SCALAR_MATH_OPS and not expands(call)))],
    )
    return any(scalar)


def vector_lanes(target: Target, sch: s_tir.Schedule, block: SBlockRV) -> int:
    """Elements of the block's output dtype in one SIMD register of ``target``."""
    bits = llvm_get_vector_width(target)
    if bits <= 0:
        bits = 128
    writes = sch.get(block).writes
    dtype_bits = writes[0].source.dtype.bits if writes else 32
    return max(bits // max(dtype_bits, 8), 1)


def largest_pow2_divisor(extent: int, limit: int) -> int:
    """The largest power of two that divides ``extent`` and is at most ``limit``."""
    lanes = 1
    while lanes * 2 <= limit and extent % (lanes * 2) == 0:
        lanes *= 2
    return lanes


def provable_pow2_divisor(extent: tirx.Expr, limit: int) -> int:
    """The largest power of two at most ``limit`` that provably divides a symbolic extent
    (``seq * 256`` by 16: yes; ``seq``: only 1)."""
    analyzer = Analyzer()
    lanes = 1
    while lanes * 2 <= limit and analyzer.can_prove(tirx.floormod(extent, lanes * 2) == 0):
        lanes *= 2
    return lanes


# Loop annotation asking TVM's LoopPartition to split the loop where a ``likely`` predicate
# under it stops holding: the whole vectors of a symbolic extent, then its tail.
PARTITION_HINT = "pragma_loop_partition_hint"


def split_vector_tail(sch: s_tir.Schedule, loop: LoopRV, lanes: int) -> tuple[LoopRV, LoopRV]:
    """``loop`` (a symbolic extent) split into (vectors, lanes) with the tail predicated.

    The outer loop carries ``PARTITION_HINT``: lowering splits it into the iterations whose
    vectors are whole, which ``VectorizeLoop`` keeps as vectors, and the last one, whose
    predicate it scalarizes. Without the hint the predicate scalarizes every iteration (a
    symbolic elementwise loop measured 8x slower than whole vectors)."""
    outer, vec = sch.split(loop, factors=[None, lanes])
    sch.annotate(outer, PARTITION_HINT, tirx.IntImm("int32", 1))
    return outer, vec


def has_partition_hint(sch: s_tir.Schedule, loop: LoopRV) -> bool:
    return PARTITION_HINT in sch.get(loop).annotations


def vectorize_innermost(sch: s_tir.Schedule, loop: LoopRV, lanes: int) -> LoopRV | None:
    """Vectorize ``loop`` (split to ``lanes`` first when longer); return the vector loop.

    A static extent is split only by a factor dividing it, so no tail predicate blocks
    vectorization; a symbolic one by ``lanes`` with the tail split off at lowering
    (``split_vector_tail``), unless ``lanes`` provably divides it.
    """
    extent = loop_extent(sch, loop)
    if extent is None:
        if provable_pow2_divisor(sch.get(loop).extent, lanes) == lanes:
            vec = sch.split(loop, factors=[None, lanes])[1]
        else:
            vec = split_vector_tail(sch, loop, lanes)[1]
    elif extent < MIN_VECTOR_EXTENT:
        return None
    elif extent <= lanes:
        vec = loop
    else:
        factor = largest_pow2_divisor(extent, lanes)
        if factor < MIN_VECTOR_EXTENT:
            return None
        vec = sch.split(loop, factors=[None, factor])[1]
    try:
        sch.vectorize(vec)
    except s_tir.ScheduleError:
        return None
    return vec


def schedule_injective_block(sch: s_tir.Schedule, block: SBlockRV, lanes: int) -> None:
    """Fuse the block's loops into a parallel outer loop over a vectorized inner loop."""
    loops = sch.get_loops(block)
    if not loops:
        return
    extents = [loop_extent(sch, loop) for loop in loops]
    work = None if None in extents else math.prod(extents)
    if len(loops) > 1 and work is not None and extents[-1] % lanes == 0:
        # Rows are whole vectors, so vectors of the fused loop never straddle two rows.
        # Not with symbolic extents: the fused index would be split again by div/mod by
        # symbolic values (``seq * 64``) that the simplifier cannot fold back.
        loops = [sch.fuse(*loops)]
    vec = None
    if not calls_scalar_math(sch.get(block)):
        vec = vectorize_innermost(sch, loops[-1], lanes)
    outer = sch.get_loops(block)
    if vec is not None or (len(outer) > 1 and extents[-1] is None):
        # a symbolic innermost loop stays serial and contiguous (LLVM may vectorize it):
        # fused into the parallel loop it would cost a div/mod by ``seq`` per element
        outer = outer[:-1]
    if outer and has_partition_hint(sch, outer[-1]):
        outer = outer[:-1]  # the vectors of a symbolic extent: split at lowering, not fused
    if not outer or (work is not None and work < MIN_PARALLEL_WORK):
        return
    try_parallel(sch, sch.fuse(*outer) if len(outer) > 1 else outer[0])


def inline_blocks(sch: s_tir.Schedule, blocks: list[SBlockInfo]) -> list[SBlockInfo]:
    """Inline what TensorIR allows (producers first, then consumers); the blocks left.

    dlight's ``try_inline``, except that a block storing an immediate is never inlined
    across, and only a refusal (``ScheduleError``, schedule unchanged) moves on to the
    next block: dlight catches everything, and a primitive that raised anything else may
    have left the schedule half-rewritten, after which the next primitive can abort the
    process.
    """

    def first_inlined(reverse: bool) -> int | None:
        primitive = sch.reverse_compute_inline if reverse else sch.compute_inline
        for i, info in enumerate(blocks):
            if inlines_a_constant(sch, info.block_rv, reverse):
                continue  # TVM would fold the immediate (schedules.constants)
            try:
                primitive(info.block_rv)
            except s_tir.ScheduleError:
                continue
            return i
        return None

    while (i := first_inlined(False)) is not None or (i := first_inlined(True)) is not None:
        blocks.pop(i)
    return blocks


class Elementwise(ScheduleRule):
    """Inline, fuse, parallelize and vectorize PrimFuncs made only of spatial blocks."""

    def is_target_available(self, target: Target) -> bool:
        return is_cpu_target(target)

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        try:
            sch = s_tir.Schedule(func)
            infos = normalize_prim_func(sch)
            if infos is None or not infos or not all(info.is_injective() for info in infos):
                return None
            # A reduction whose reduce loops all have extent 1 looks injective to dlight, but
            # inlining a block with an init aborts the process inside TVM: not ours to schedule.
            if any(bool(info.is_reduction()) for info in infos):
                return None
            for info in inline_blocks(sch, infos):
                schedule_injective_block(sch, info.block_rv, vector_lanes(target, sch, info.block_rv))
        except Exception:  # noqa: BLE001 - ScheduleError / InternalError: leave it to the fallback
            return None
        return sch
