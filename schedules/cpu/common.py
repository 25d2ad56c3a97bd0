"""Helpers the CPU schedule rules share: constant extents and work of a loop nest, buffer sizes, how a
block's loops bind its iterators, checked parallel marking, the target's SIMD width and
cores, and the vectorization of an innermost loop.

Built on dlight where it has the helper (``get_extent``, a block's ``SBlockRealize``; the
rules call ``get_root_block`` and ``normalize_prim_func`` themselves).  What is here
either has no dlight counterpart or means something else, said in its docstring.
"""

from __future__ import annotations

import math

import tvm_ffi
from tvm import ir, s_tir, tirx
from tvm.s_tir.dlight.analysis.common_analysis import get_sblockrealize
from tvm.s_tir.dlight.base import get_extent
from tvm.s_tir.schedule import LoopRV, SBlockRV
from tvm.sym.analyzer import Analyzer
from tvm.target import Target, codegen

from aicf_tvm.core.emit import PLAN_ATTR

from .vector_math import expands

# Below this many iterations of the whole nest a parallel launch costs more than it saves.
MIN_PARALLEL_WORK = 4096
# Parallel tasks wanted per core before a rule splits its tasks finer (depthwise and dense
# convolutions by rows, row norms by row groups): with fewer, the cores' shares are unequal.
TASKS_PER_CORE = 4
# Vectorize only loops with at least this many iterations.
MIN_VECTOR_EXTENT = 4


def is_one(expr: tirx.Expr) -> bool:
    """Whether ``expr`` is the constant 1 (an extent of one, or a predicate that is True)."""
    return isinstance(expr, tirx.IntImm) and expr.value == 1


def static_extent(extent: tirx.Expr) -> int | None:
    """The extent as an int, None when it is symbolic."""
    return int(extent.value) if isinstance(extent, tirx.IntImm) else None


def buffer_bytes(buffer: tirx.Buffer) -> int | None:
    """Bytes of a constant-shape buffer (vector lanes counted), None when a dim is symbolic."""
    dims = [static_extent(d) for d in buffer.shape]
    if any(d is None for d in dims):
        return None
    return math.prod(dims) * buffer.dtype.bits * buffer.dtype.lanes // 8


def loop_extent(sch: s_tir.Schedule, loop: LoopRV) -> int | None:
    """The loop's constant extent, None when it is symbolic (dlight's ``get_extent``
    returns the expression instead)."""
    extent = get_extent(sch, loop)
    return extent if isinstance(extent, int) else None


def nest_work(sch: s_tir.Schedule, loop: LoopRV) -> int | None:
    """Statement instances executed by the nest under ``loop`` (None if symbolic)."""
    return _stmt_work(sch.get(loop))


def _stmt_work(stmt: tirx.Stmt) -> int | None:
    if isinstance(stmt, tirx.For):
        inner = _stmt_work(stmt.body)
        if not isinstance(stmt.extent, tirx.IntImm) or inner is None:
            return None
        return int(stmt.extent.value) * inner
    if isinstance(stmt, s_tir.SBlockRealize):
        return _stmt_work(stmt.block.body)
    if isinstance(stmt, tirx.SeqStmt):
        parts = [_stmt_work(s) for s in stmt.seq]
        return None if None in parts else sum(parts)
    return 1


def uses_var(expr: tirx.Expr, var: tirx.Var) -> bool:
    """Whether ``var`` occurs free in ``expr``."""
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))


def nodes_in(node, kind: type) -> list:
    """Every node of type ``kind`` under ``node`` (itself included), in program order."""
    found: list = []
    tvm_ffi.structural_walk(node, [(kind, found.append)], order="pre")
    return found


def conjuncts(expr: tirx.Expr) -> list[tirx.Expr]:
    """The terms of ``expr`` as a chain of ``and``s (``[expr]`` for any other expression)."""
    if isinstance(expr, tirx.And):
        return conjuncts(expr.a) + conjuncts(expr.b)
    return [expr]


def conjunction(exprs: list[tirx.Expr]) -> tirx.Expr:
    """``exprs`` joined by ``and`` in order (``True`` for none): the inverse of ``conjuncts``."""
    out = exprs[0] if exprs else tirx.const(True, "bool")
    for expr in exprs[1:]:
        out = tirx.And(out, expr)
    return out


def bound_iters(sch: s_tir.Schedule, block: SBlockRV, loop: LoopRV) -> list[tirx.IterVar]:
    """The block iterators whose binding uses ``loop``'s variable."""
    realize = get_sblockrealize(sch, block)
    var = sch.get(loop).loop_var
    pairs = zip(realize.block.iter_vars, realize.iter_values)
    return [iv for iv, value in pairs if uses_var(value, var)]


def loop_kinds(sch: s_tir.Schedule, block: SBlockRV) -> str:
    """One letter per loop of ``block``: 'S' binds only spatial iterators (or none),
    'R' binds only reduction iterators, 'O' anything else.

    Per loop, in the schedule as it is now (after fuse/split/compute_at); dlight's
    ``SBlockInfo.dom_kind`` gives one letter per block iterator, which matches the loops
    only in the normal form ``normalize_prim_func`` produces.
    """
    kinds = []
    for loop in sch.get_loops(block):
        used = {int(iv.iter_type) for iv in bound_iters(sch, block, loop)}
        if used <= {tirx.IterVar.DataPar}:
            kinds.append("S")
        elif used == {tirx.IterVar.CommReduce}:
            kinds.append("R")
        else:
            kinds.append("O")
    return "".join(kinds)


def try_parallel(sch: s_tir.Schedule, loop: LoopRV) -> bool:
    """Mark ``loop`` parallel if TensorIR proves it legal; True when it did."""
    try:
        sch.parallel(loop)
    except s_tir.ScheduleError:
        return False
    return True


def _has_feature(target: Target, feature: str) -> bool:
    try:
        return bool(codegen.llvm_cpu_has_features(feature, target))
    except Exception:  # noqa: BLE001 - a target LLVM cannot describe
        return False


def vector_bits(target: Target) -> int:
    """Bits of the target's widest vector register (128, SSE, when LLVM cannot say).

    On x86 the answer comes from the CPU's features: TVM 0.27's ``llvm_get_vector_width``
    says 512 for every x86 CPU, AVX2-only ones (Haswell, Zen 2) included, which would plan
    every kernel for registers twice as wide, and twice as many, as the CPU has.
    """
    if _has_feature(target, "sse2"):
        if _has_feature(target, "avx512f"):
            return 512
        return 256 if _has_feature(target, "avx") else 128
    try:
        bits = int(codegen.llvm_get_vector_width(target))
    except Exception:  # noqa: BLE001 - a target LLVM cannot describe
        bits = -1
    return bits if bits > 0 else 128


def vector_registers(target: Target) -> int:
    """Architectural vector registers: 32 with AVX-512 and on AArch64, 16 on other x86."""
    if _has_feature(target, "sse2"):
        return 32 if _has_feature(target, "avx512f") else 16
    return 32 if _has_feature(target, "neon") else 16


def gemm_tiles_by_area(target: Target) -> bool:
    """Whether the GEMM rule picks its register tile by accumulator count (``gemm_plan``'s
    ``tile_by_area``): on x86 with AVX-512, except AMD's Zen cores (``mcpu=znver*``).

    Measured, not derived: on an Intel Xeon (AVX-512) tuning chose 8 rows x 3 vectors
    over the widest-first 4 x 4 for every 128-row GEMM of BERT and GPT-2, and as the
    default it ran those models faster with the same output bits; on Zen 5 that tile was
    a tuning candidate of the same GEMMs and never won in the model, and AVX2's tiles
    were calibrated on Zen 3 (docs/benchmarks-history.md).
    """
    if not _has_feature(target, "avx512f"):
        return False
    return not str(target.attrs.get("mcpu", "")).startswith("znver")


def float32_lanes(target: Target) -> int:
    """float32 lanes of one vector register, at least 4: the GEMM kernel's tile unit."""
    return max(4, vector_bits(target) // 32)


def output_lanes(target: Target, sch: s_tir.Schedule, block: SBlockRV) -> int:
    """Elements of the block's output dtype in one vector register (at least 1)."""
    writes = sch.get(block).writes
    dtype_bits = writes[0].source.dtype.bits if writes else 32
    return max(vector_bits(target) // max(dtype_bits, 8), 1)


def num_cores(target: Target) -> int:
    """The target's ``num-cores`` (1 when absent)."""
    cores = target.attrs.get("num-cores", None)
    return int(cores) if cores is not None else 1


# Calls LLVM expands into one libm call per lane on x86 (there is no vector math library
# in the TVM build): vectorizing a block that makes them only adds lane shuffles around
# the same calls, slower than the scalar loop.  The float32 ones ``VectorizeMath``
# expands into arithmetic after scheduling (``vector_math.expands``) do not count.
SCALAR_MATH_OPS = frozenset(
    f"tirx.{name}"
    for name in (
        "exp", "exp2", "exp10", "expm1", "log", "log2", "log10", "log1p", "erf", "tanh",
        "sigmoid", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh",
        "pow", "fmod",
    )
)  # fmt: skip


def math_calls(node: object) -> list[ir.Call]:
    """The calls of a math function of ``SCALAR_MATH_OPS`` in ``node`` (a block's body, a
    PrimFunc), those ``VectorizeMath`` expands later included."""
    found: list[ir.Call] = []
    tvm_ffi.structural_walk(node, [(ir.Call, lambda call: found.append(call)
                                    if getattr(call.op, "name", "") in SCALAR_MATH_OPS else None)])
    return found


def calls_math(node: object) -> bool:
    """Whether ``node`` calls a math function of ``SCALAR_MATH_OPS``, expanded later or not."""
    return bool(math_calls(node))


def calls_scalar_math(block: s_tir.SBlock) -> bool:
    """Whether the block's body calls a math function that stays a libm call per lane."""
    return any(not expands(call) for call in math_calls(block.body))


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

# A rule's choices for one kernel, as a line of text (``PLAN_ATTR``): a block annotation the
# rule sets (``note_plan``) and ``schedules.schedule_func`` copies into the PrimFunc's
# attributes, where ``aicf explain`` and ``CompiledModel.kernels`` read it.


def note_plan(sch: s_tir.Schedule, block: SBlockRV, text: str) -> None:
    """Record ``text`` (the rule's tile sizes and layout choices) on ``block``."""
    sch.annotate(block, PLAN_ATTR, text)


def plan_of(func: tirx.PrimFunc) -> str | None:
    """The plan a rule noted in ``func`` (``note_plan``), if any."""
    found = [str(block.annotations[PLAN_ATTR]) for block in nodes_in(func.body, s_tir.SBlock)
             if PLAN_ATTR in block.annotations]
    return found[0] if found else None


def split_vector_tail(sch: s_tir.Schedule, loop: LoopRV, lanes: int) -> tuple[LoopRV, LoopRV]:
    """``loop`` (a symbolic extent) split into (vectors, lanes) with the tail predicated.

    The outer loop carries ``PARTITION_HINT``: lowering splits it into the iterations whose
    vectors are whole, which ``VectorizeLoop`` keeps as vectors, and the last one, whose
    predicate it scalarizes. Without the hint the predicate scalarizes every iteration (a
    symbolic elementwise loop then runs lane by lane, far slower than whole vectors)."""
    outer, vec = sch.split(loop, factors=[None, lanes])
    sch.annotate(outer, PARTITION_HINT, tirx.IntImm("int32", 1))
    return outer, vec


def has_partition_hint(sch: s_tir.Schedule, loop: LoopRV) -> bool:
    return PARTITION_HINT in sch.get(loop).annotations


def vectorize_innermost(sch: s_tir.Schedule, loop: LoopRV, lanes: int) -> LoopRV | None:
    """Vectorize ``loop`` (split to ``lanes`` first when longer); return the vector loop.

    A static extent is split only by a factor dividing it, so no tail predicate blocks
    vectorization; a symbolic one by ``lanes`` with the tail split off at lowering
    (``split_vector_tail``), unless ``lanes`` provably divides it.  dlight's
    ``auto_vectorize`` splits by ``lanes`` whatever the extent, leaving a tail predicate
    on every iteration.
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
