"""The GEMM micro-kernel's accumulators in registers, each K block's sums started from
zero there, and the next packed B panel prefetched while the current one is in use.

Blocked sums: a K loop marked ``K_SUMS`` (a GEMM with several K blocks) starts its register
tile at zero and adds it to C after the block, instead of carrying C's running sum
through every product of K: each output is the sum over K blocks (in order) of each
block's sum (k ascending).  A matrix product states no order of its sum (docs/numerics.md,
"contraction only in dot products"), and this one errs less: a serial float32 sum of K
products has an error bound growing with K, the blocked one with ``kc + K / kc``, as the
BLAS libraries' kernels sum (MKL, OpenBLAS, oneDNN start each K block's accumulators at
zero).  On BERT's 128 x 3072 -> 768 GEMM the largest error against float64 fell from ~5x
PyTorch float32's to its level.  The first block adds its sum to C's initial +0, which
changes no value (a sum from +0 is never -0).  Integer GEMMs are left as they are (their
sums are exact in any order), and so is a marked loop whose stores are not each a running
sum of their own element (``_running_sums``).

Inside a model a GEMM's weights come from memory, not from the caches a GEMM timed
alone runs in: BERT's 3072 x 768 GEMM runs markedly slower with a fresh copy of its
packed B each call (the model's case) than with B warm, and its first strip over each
B panel runs at memory speed while the next strips run from L2.

The rule: each step of the K loop prefetches, into L2, one cache line of the B panel the
nest reads next (the next panel; after the last panel, the first panel of the next K
block).  The panel's ``kc x lines`` lines are spread evenly over the ``strips x kc``
steps that use the current panel: step ``t = strip * kc + k`` fetches line
``t * lines // strips``, so the next panel arrives at the pace it is computed on.  That
brought the cold GEMM most of the way back to its warm time (the warm time unchanged),
with the lines fetched in the first strips of each panel (the strip choosing a line of
the ``k`` row); spreading them over all strips then made BERT, GPT-2 and LLaMA faster
end to end (ViT unchanged), in one process, the same bits.

A prefetch is a call LLVM cannot see through, and with one inside the K loop LLVM no
longer keeps the accumulator tile in registers (it is a workspace buffer that LLVM
promotes itself only when nothing else in the loop may touch memory), and every FMA
then loads and stores its accumulator.  So the rewrite first moves the tile into a ``local`` buffer for the length of
the K loop (loaded before it, stored after it; scalar promotion made explicit), which
LLVM keeps in registers whatever else the loop calls.

Why it is sound: a prefetch changes no value (it cannot fault, and the address is
clamped into B).  The promotion is done only where every access to the accumulator
buffer inside the K loop is a load or a store at an index that does not depend on
``k`` and differs from the others by a constant (so no two names share an element and
none is reached another way); the buffer is the kernel's own allocation, so nothing
outside the loop body aliases it; the loop is serial, so a load before it and a store
after it see exactly the values the loop would have read first and written last.
Anything else leaves the loop as it was.

``tile_gemm`` marks the loops (``mark_loops``); ``PrefetchNextPanel`` rewrites them on
lowered TIR (``parallel_guard.tir_pipeline``), where the index of every access is final.
"""

from __future__ import annotations

import itertools

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.schedule import LoopRV
from tvm.sym.analyzer import Analyzer
from tvm.target import Target

from .common import buffer_bytes, static_extent, uses_var
from .gemm_plan import GemmPlan
from .llvm_pass import llvm_prim_func_pass
from .stack_tiles import DISABLE_LOWER_BUILTIN, MAX_TILE_BYTES

# Loop annotations tile_gemm sets: the K loop (value: lines of one packed B row), the
# strip loop above it, the panel loop and the K-block loop.
K_LOOP, STRIP, PANEL, K_BLOCK = "aicf.gemm_k", "aicf.gemm_strip", "aicf.gemm_panel", "aicf.gemm_kblock"
# on the K loop: its block's sums start from zero in the register tile and are added to C after it
K_SUMS = "aicf.gemm_k_sums"
CACHE_LINE = 64
# tirx.prefetch's locality argument: 2 (prefetcht1) brings the line into L2, which holds
# a whole K block of panels; into L1 (3) it measured slower, evicting the live panel.
L2_LOCALITY = 2


def prefetch_pays(plan: GemmPlan, registers: int) -> bool:
    """Whether the nest of ``plan`` prefetches the next panel.

    The prefetch's address (the line of the next panel, the panel after the last one, the
    clamp) costs about a dozen scalar instructions per K step.  A 32-register tile (AVX-512:
    8 rows x 3 vectors) does 24 FMAs per step, and there BERT, GPT-2 and LLaMA ran faster with
    it.  A 16-register tile (AVX2: 6 rows x 2 vectors) does 12, and the prefetch then pays
    only where each panel is read by one block of rows per K block (a static M of one
    ``mc`` block, or a symbolic M: an LLM's steps), so that every panel streams in from
    memory; with several row blocks the later ones find the panels in L2 and the prefetch
    only costs.  On a 2-core Zen 3, in one process, with the same bits, prefetching off
    ran ViT (197 rows: 3 blocks) in 0.84 of the time, Swin 0.94, BERT and LLaMA (128 rows:
    2 blocks) 0.97, GPT-2 and Whisper's encoder 0.99-1.01, and a Qwen2-style decoder (96
    rows: one block) 1.04-1.08 (slower).
    """
    if registers >= 32:
        return True
    return plan.m_padded is None or plan.m_padded <= plan.mc


def mark_loops(sch: s_tir.Schedule, k_inner: LoopRV, strip: LoopRV | None, panel: LoopRV | None,
               k_block: LoopRV | None, nr: int, dtype: str, prefetch: bool = True, blocked_sums: bool = False) -> None:
    """Annotate the BLIS nest's loops for ``PrefetchNextPanel``: ``prefetch`` the next
    panel (nothing is prefetched without a panel or a K-block loop: no next panel to
    fetch), ``blocked_sums`` each K block's sums from zero (with a K-block loop only)."""
    if blocked_sums and k_block is not None and _is_float(dtype):
        sch.annotate(k_inner, K_SUMS, 1)
    if not prefetch or (panel is None and k_block is None):
        return
    lines = max(1, -(-nr * tvm.runtime.DataType(dtype).bits // 8 // CACHE_LINE))
    sch.annotate(k_inner, K_LOOP, lines)
    for loop, key in ((strip, STRIP), (panel, PANEL), (k_block, K_BLOCK)):
        if loop is not None:
            sch.annotate(loop, key, 1)


def _inline_binds(stmt: tirx.Stmt) -> tirx.Stmt:
    """``stmt`` (a loop body) with its ``Bind`` statements substituted into what follows."""
    env: dict = {}

    def sub(node):
        return tvm_ffi.structural_map(node, [(tirx.Var, lambda v: env.get(v, v))]) if env else node

    def go(s: tirx.Stmt) -> tirx.Stmt | None:
        if isinstance(s, tirx.Bind):
            env[s.var] = sub(s.value)
            return None
        if isinstance(s, tirx.SeqStmt):
            seq = [y for y in (go(x) for x in s.seq) if y is not None]
            return seq[0] if len(seq) == 1 else tirx.SeqStmt(seq)
        return sub(s)

    return go(stmt)


def mark_blocked_sums(sch: s_tir.Schedule, loop: LoopRV, dtype: str) -> None:
    """Mark ``loop`` (a reduction loop under an outer one, a whole block of the sum inside
    it) to sum from zero in its register tile (``K_SUMS``); a float ``dtype`` only."""
    if _is_float(dtype):
        sch.annotate(loop, K_SUMS, 1)


def _inner_loop_vars(body: tirx.Stmt) -> list[tirx.Var]:
    found: list[tirx.Var] = []
    tvm_ffi.structural_walk(body, [(tirx.For, lambda f: found.append(f.loop_var))])
    return found


def _accesses(body: tirx.Stmt) -> tuple[list, list, list]:
    stores, loads, calls = [], [], []
    tvm_ffi.structural_walk(body, [
        (tirx.BufferStore, lambda s: stores.append(s)),
        (tvm.ir.TensorLoad, lambda e: loads.append(e)),
        (tvm.ir.Call, lambda c: calls.append(c)),
    ])
    return stores, loads, calls


def _span(index) -> tuple:
    """(first element, elements) an access index covers; None for a strided vector."""
    if isinstance(index, tirx.Ramp):
        stride = index.stride
        if not isinstance(stride, tirx.IntImm) or int(stride.value) != 1:
            return None
        return index.base, int(index.lanes)
    return index, 1


def _register_tile(stores: list, loads: list, calls: list, k: tirx.Var, owned: list, inner: list):
    """(accumulator buffer, its distinct access indices, their value type) when every
    access (``_accesses`` of the K-loop body) to the one buffer the body stores to is
    promotable (module docstring; ``inner``: the loop vars of loops inside the body, which
    no index may use either), else None."""
    if not stores or calls:
        return None
    acc = stores[0].buffer
    if any(not s.buffer.same_as(acc) for s in stores) or not any(acc.same_as(b) for b in owned):
        return None
    value_type = str(stores[0].value.ty)
    indices, spans = [], []
    moving = [k, *inner]  # an index moving with any loop of the body names several elements
    for access in [*stores, *(e for e in loads if e.source.same_as(acc))]:
        if len(access.indices) != 1 or any(uses_var(access.indices[0], v) for v in moving):
            return None
        index = access.indices[0]
        span = _span(index)
        if span is None:
            return None
        if not any(tvm_ffi.structural_equal(index, seen) for seen in indices):
            indices.append(index)
            spans.append(span)
    if any(str(s.value.ty) != value_type for s in stores) or len({width for _, width in spans}) != 1:
        return None
    width = spans[0][1]
    analyzer = Analyzer()
    starts = []
    for first, _ in spans:
        offset = analyzer.simplify(first - spans[0][0])
        if not isinstance(offset, tirx.IntImm):
            return None
        starts.append(int(offset.value))
    starts.sort()
    if any(b - a < width for a, b in itertools.pairwise(starts)):
        return None  # two names for one element
    return acc, indices, value_type


def _packed_b(loads: list, acc: tirx.Buffer, k: tirx.Var):
    """(buffer, index of the first lane) of the one buffer other than the accumulator the
    K-loop body (its ``loads``) reads whole vectors of at an index moving with ``k``: the
    packed B; None when there is not exactly one."""
    found = {}
    for load in loads:
        index = load.indices[0] if len(load.indices) == 1 else None
        if load.source.same_as(acc) or not isinstance(index, tirx.Ramp):
            continue
        if uses_var(index.base, k):
            found.setdefault(load.source, index.base)
    if len(found) != 1:
        return None
    return next(iter(found.items()))


class _Rewriter:
    def __init__(self, func: tirx.PrimFunc):
        self.loops: dict = {}  # annotated loop var -> its For
        self.owned: list = []  # the function's own allocations
        self.k_loops = 0  # K loops marked to rewrite

        def on_for(loop: tirx.For):
            self.k_loops += K_LOOP in loop.annotations or K_SUMS in loop.annotations
            for key in (STRIP, PANEL, K_BLOCK):
                if key in loop.annotations:
                    self.loops[loop.loop_var] = (key, loop)

        def on_alloc(alloc: tirx.AllocBuffer):
            self.owned.append(alloc.buffer)

        tvm_ffi.structural_walk(func.body, [(tirx.For, on_for), (tirx.AllocBuffer, on_alloc)])

    def enclosing(self, expr, key: str) -> tirx.For | None:
        for var, (role, loop) in self.loops.items():
            if role == key and uses_var(expr, var):
                return loop
        return None

    def rewrite_k(self, k_loop: tirx.For) -> tirx.Stmt:
        k = k_loop.loop_var
        body = _inline_binds(k_loop.body)
        stores, loads, calls = _accesses(body)
        tile = _register_tile(stores, loads, calls, k, self.owned, _inner_loop_vars(body))
        if tile is None:
            return k_loop
        acc, indices, value_type = tile
        tile_buf = tirx.decl_buffer((len(indices),), value_type, f"{acc.name}_tile", scope="local")
        if buffer_bytes(tile_buf) > MAX_TILE_BYTES:
            return k_loop  # not a register tile
        blocked = K_SUMS in k_loop.annotations and _is_float(value_type) and _running_sums(stores, acc)
        prefetch = self._prefetch(k_loop, body, loads, acc) if K_LOOP in k_loop.annotations else None
        if prefetch is None and not blocked:
            return k_loop

        def slot(index):
            for i, seen in enumerate(indices):
                if tvm_ffi.structural_equal(index, seen):
                    return tirx.const(i, "int32")
            raise AssertionError(index)

        def on_store(s: tirx.BufferStore):
            return tirx.BufferStore(tile_buf, s.value, [slot(s.indices[0])]) if s.buffer.same_as(acc) else s

        def on_load(e):
            return tirx.BufferLoad(tile_buf, [slot(e.indices[0])]) if e.source.same_as(acc) else e

        body = tvm_ffi.structural_map(body, [(tirx.BufferStore, on_store), (tvm.ir.TensorLoad, on_load)])
        loop = tirx.For(k, k_loop.min, k_loop.extent, k_loop.kind,
                        body if prefetch is None else tirx.SeqStmt([prefetch, body]),
                        annotations={key: value for key, value in k_loop.annotations.items()
                                     if key not in (K_LOOP, K_SUMS)})
        slots = [tirx.const(i, "int32") for i in range(len(indices))]
        if blocked:  # the block's sums from zero, then added to C's running sum
            load = [tirx.BufferStore(tile_buf, _zero(value_type), [i]) for i in slots]
            store = [tirx.BufferStore(acc, tirx.BufferLoad(acc, [index]) + tirx.BufferLoad(tile_buf, [i]), [index])
                     for i, index in zip(slots, indices)]
        else:
            load = [tirx.BufferStore(tile_buf, tirx.BufferLoad(acc, [index]), [i]) for i, index in zip(slots, indices)]
            store = [tirx.BufferStore(acc, tirx.BufferLoad(tile_buf, [i]), [index]) for i, index in zip(slots, indices)]
        alloc = tirx.AllocBuffer(tile_buf, {DISABLE_LOWER_BUILTIN: tirx.IntImm("bool", 1)})
        return tirx.SeqStmt([alloc, *load, loop, *store])

    def _prefetch(self, k_loop: tirx.For, body: tirx.Stmt, loads: list, acc: tirx.Buffer) -> tirx.Stmt | None:
        """The prefetch of the next panel's line for this step of ``k_loop``; None when the
        packed B or its next panel is not found."""
        k = k_loop.loop_var
        b_found = _packed_b(loads, acc, k)
        if b_found is None:
            return None
        b, base = b_found
        panel, k_block = self.enclosing(base, PANEL), self.enclosing(base, K_BLOCK)
        target = _next_panel(base, panel, k_block)
        if target is None:
            return None
        lines = int(getattr(k_loop.annotations[K_LOOP], "value", k_loop.annotations[K_LOOP]))
        strip_loop = self.enclosing(body, STRIP)
        strip = None if strip_loop is None else strip_loop.loop_var
        per_line = CACHE_LINE * 8 // tvm.runtime.DataType(str(b.dtype)).bits
        strips = None if strip is None else static_extent(strip_loop.extent)
        kc = static_extent(k_loop.extent)
        if strips is not None and kc is not None:
            # the panel's kc x lines lines spread evenly over the strips x kc steps
            step = (strip - strip_loop.min) * kc + (k - k_loop.min)
            line = tirx.floordiv(step * lines, strips)
            row = k_loop.min + tirx.floordiv(line, lines)
            target = tvm_ffi.structural_map(target, [(tirx.Var, lambda v: row if v.same_as(k) else v)])
            target = target + tirx.Cast(str(target.ty), tirx.floormod(line, lines) * per_line)
        elif strip is not None and lines > 1:
            target = target + tirx.Cast(str(target.ty), tirx.floormod(strip, lines) * per_line)
        size = 1
        for extent in b.shape:
            size = size * extent
        last = tirx.Cast(str(target.ty), tirx.max(size - per_line, 0))
        index = Analyzer().simplify(tirx.min(target, last))
        address = tirx.call_intrin("handle", "tirx.address_of", tirx.BufferLoad(b, [index]))
        return tirx.Evaluate(tirx.call_intrin("void", "tirx.prefetch", address, 0, L2_LOCALITY, 1))

    def visit(self, stmt: tirx.Stmt) -> tirx.Stmt:
        def on_for(loop: tirx.For):
            if K_LOOP not in loop.annotations and K_SUMS not in loop.annotations:
                return loop
            try:
                return self.rewrite_k(loop)
            except Exception:  # noqa: BLE001 - a form the rewrite does not know: the loop as it was
                return loop

        return tvm_ffi.structural_map(stmt, [(tirx.For, on_for)])


def _running_sums(stores: list, acc: tirx.Buffer) -> bool:
    """Whether every store to ``acc`` adds to the element it stores to (``acc[i] = acc[i] +
    x``, either operand order): only then may a block's terms be summed apart and added."""
    def adds_to_itself(store: tirx.BufferStore) -> bool:
        value = store.value
        if not isinstance(value, tirx.Add):
            return False
        return any(isinstance(operand, tvm.ir.TensorLoad) and operand.source.same_as(acc)
                   and tvm_ffi.structural_equal(operand.indices[0], store.indices[0])
                   for operand in (value.a, value.b))

    return all(adds_to_itself(s) for s in stores if s.buffer.same_as(acc))


def _is_float(dtype: str) -> bool:
    return tvm.runtime.DataType(dtype).type_code == tvm.runtime.DataTypeCode.FLOAT


def _zero(value_type: str) -> tirx.PrimExpr:
    """+0 of ``value_type`` (a vector of them for a vector type)."""
    dtype = tvm.runtime.DataType(value_type)
    zero = tirx.FloatImm(f"float{dtype.bits}", 0.0)
    return zero if dtype.lanes == 1 else tirx.Broadcast(zero, dtype.lanes)


def _next_panel(base, panel: tirx.For | None, k_block: tirx.For | None):
    """The index of the B element the nest reads at this ``k`` of the next panel: panel
    ``j + 1``, or after the last panel, panel 0 of the next K block (the last K block's
    last panel fetches its first panel's row again, a line the nest has just read)."""

    def at(loop: tirx.For, value):
        return tvm_ffi.structural_map(base, [(tirx.Var, lambda v: value if v.same_as(loop.loop_var) else v)])

    def last(loop: tirx.For):
        return loop.loop_var < loop.min + loop.extent - 1

    following = base
    if k_block is not None:
        following = tirx.Select(last(k_block), at(k_block, k_block.loop_var + 1), base)
    if panel is None:
        return None if k_block is None else following
    if k_block is not None:
        following = tvm_ffi.structural_map(
            following, [(tirx.Var, lambda v: panel.min if v.same_as(panel.loop_var) else v)])
    return tirx.Select(last(panel), at(panel, panel.loop_var + 1), following)


def prefetch_next_panel(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each marked GEMM K loop rewritten (module docstring)."""
    if func.body is None:
        return func
    rewriter = _Rewriter(func)
    if not rewriter.k_loops:
        return func
    return func.with_body(rewriter.visit(func.body))


def PrefetchNextPanel(target: Target | None = None) -> tvm.transform.Pass:
    """PrimFunc pass applying ``prefetch_next_panel`` to the PrimFuncs compiled for an
    LLVM target."""
    return llvm_prim_func_pass(prefetch_next_panel, target, "PrefetchNextPanel")
