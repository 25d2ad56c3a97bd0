"""Keys a causal mask hides, skipped by the attention kernel when a check per call proves
they add nothing.

Row i of a prompt that follows ``past`` cached tokens sees keys [0, past + i]; its mask is
-inf over the rest of the row, about half of all scores in a prefill.  The Attention rule's
kernel computes every score and adds it in.  ``skip_masked_keys`` rewrites the scheduled
kernel so that each row tile computes keys [0, L) only, L the last key any of its rows
leaves open, plus one, rounded up to the kernel's key chunks (at most the key count): every
loop over the keys inside the tile loops stops at L.

Why the result keeps its bits.  The kernel is the fused_attention Emit: S = q'·k'ᵀ (q', k'
the kernel's own scaled copies), S + mask, softmax over the keys, optionally SDPA's guard
``where(all(S + mask == neg_inf), zero, P)``, then P·v.  For a key j of row i with
``mask[i, j] == -inf`` and S[i, j] neither +inf nor NaN, S + mask is -inf exactly, and then

* the row max is unchanged: max(x, -inf) = x (the max starts at -FLT_MAX), NaN aside (a NaN
  score among the computed keys makes the row's sum, every P and every output NaN, skipped
  keys or not);
* the row sum gains exp(-inf - max) = +0, which changes no sum that starts at +0 (such a sum
  is never -0);
* SDPA's guard: the key counts as masked when neg_inf is -inf, so "any key kept" depends on
  the computed keys only; a row the guard zeroes has P = ``zero`` everywhere, which adds
  ``zero``·v[j] = ±0 only when ``zero`` is 0;
* P[i, j] = +0 / sum, and the output gains 0·v[j] = ±0 when v[j] is finite: no change.

S[i, j] is finite when every q' and k' is finite and d·max|q'|·max|k'| <= FLT_MAX / 4 (d the
dot product's length): each partial sum is at most d·max|q'|·max|k'|·(1+u)^d in magnitude,
below FLT_MAX / 2 for any d under 2^22.  The kernel checks all of it on every call before
any tile runs (block ``key_limits``): per row tile it scans the mask rows for the last key
that is not -inf (a NaN counts as open); when some tile would skip keys, it checks q' and k'
as the kernel's copy blocks compute them, v as P·v reads it (finite), neg_inf == -inf and
zero == 0 where the Emit has the guard.  When a check fails every tile computes every key,
the kernel as scheduled; a mask that hides no whole chunk of keys costs the scan alone.  A tile computes
at least one key: the row max and the guard need one to start from.

The row tiles then carry unequal work (a causal prompt's first tile a chunk of keys, its
last tile all of them), and TVM's thread pool gives each thread a contiguous range of a
parallel loop's iterations: the tile loops run the row tiles in the order 0, T-1, 1, T-2,
... (``_zigzag``), so that each range holds long and short tiles alike.  A legal parallel
loop's iterations are independent; the order changes no result.

Applies to kernels whose key count is symbolic and whose mask has a row per query row and
broadcasts over batch and heads (``[1, .., 1, rows, keys]``: an LLM's prompt); elsewhere
the kernel is returned as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import lcm

import numpy as np
import tvm_ffi
from tvm import ir, s_tir, tirx
from tvm.sym import IntervalSet
from tvm.sym.analyzer import Analyzer

from aicf_tvm.core.emit import ABI_ATTR

from .common import is_one, nodes_in, uses_var

FLT_MAX = float(np.finfo(np.float32).max)
# d·max|q'|·max|k'| at most this: every partial sum of the scores stays finite (docstring)
SCORE_BOUND = FLT_MAX / 4
KEY_LIMITS = "key_limits"

_Load = ir.TensorLoad  # TVM 0.27: tirx.BufferLoad is a constructor function (gemm_analysis)


@dataclass(frozen=True)
class _Check:
    """Values the kernel computes (``value`` over ``domain``, ``inner`` its contiguous
    iter) whose largest magnitude the key_limits block takes; a non-finite one counts as inf."""

    domain: tuple[tuple[tirx.Var, tirx.Expr], ...]
    inner: tirx.Var | None
    value: tirx.Expr


@dataclass(frozen=True)
class _Attention:
    mask: tirx.Var  # the mask parameter, [1, .., 1, rows, keys]
    rows: tirx.Var
    keys: tirx.Var
    neg_inf: tirx.Var | None
    zero: tirx.Var | None
    q: _Check
    k: _Check
    v: _Check
    dot: tirx.Expr  # d, the length of q'·k'


def _ports(func: tirx.PrimFunc) -> dict[str, tirx.Var] | None:
    """The kernel's parameters by Emit port (``aicf.abi``); None where a port of the guard
    or the mask is bound to an immediate (not read from a parameter)."""
    abi = func.attrs.get(ABI_ATTR) if func.attrs is not None else None
    if abi is None:
        return None
    entries = [dict(e) for e in abi]
    tensors = [str(e["port"]) for e in entries if not e.get("scalar")]
    if len(tensors) != len(func.params):
        return None
    if any(str(e["port"]) in ("mask", "neg_inf", "zero") and e.get("scalar") for e in entries):
        return None
    return dict(zip(tensors, func.params))


def _mac(block: s_tir.SBlock) -> tuple[tirx.Var, _Load, _Load] | None:
    """``(C, A[..], B[..])`` of a block ``C = C + A * B`` (init split off or not)."""
    store = block.body
    if not isinstance(store, tirx.BufferStore) or not isinstance(store.value, tirx.Add):
        return None
    acc, prod = store.value.a, store.value.b
    if not isinstance(acc, _Load):
        acc, prod = prod, acc
    if not isinstance(acc, _Load) or not acc.source.same_as(store.buffer) or not isinstance(prod, tirx.Mul):
        return None
    if not isinstance(prod.a, _Load) or not isinstance(prod.b, _Load):
        return None
    return store.buffer, prod.a, prod.b


def _loads(expr: tirx.Expr) -> list[_Load]:
    return nodes_in(expr, _Load)


def _check(block: s_tir.SBlock, value: tirx.Expr, params: list[tirx.Var]) -> _Check | None:
    """``value`` (computed by ``block``) over the iters it reads; None unless it reads
    parameters only.  Its contiguous iter: the last index of a parameter it loads."""
    loads = _loads(value)
    if not loads or not all(any(ld.source.same_as(p) for p in params) for ld in loads):
        return None
    domain = tuple((iv.var, iv.dom.extent) for iv in block.iter_vars if uses_var(value, iv.var)
                   and isinstance(iv.dom.min, tirx.IntImm) and iv.dom.min.value == 0)
    if len(domain) != sum(uses_var(value, iv.var) for iv in block.iter_vars):
        return None
    last = loads[0].indices[-1]
    inner = next((v for v, _ in domain if last.same_as(v)), None)
    return _Check(domain, inner, value)


def _operand(load: _Load, reader: s_tir.SBlock, blocks: list[s_tir.SBlock],
             params: list[tirx.Var]) -> _Check | None:
    """What a matmul operand holds: the parameter as read, or the copy block writing it."""
    if any(load.source.same_as(p) for p in params):
        return _check(reader, load, params)
    writers = [b for b in blocks if isinstance(b.body, tirx.BufferStore) and b.body.buffer.same_as(load.source)]
    if len(writers) != 1 or writers[0].init is not None:
        return None
    return _check(writers[0], writers[0].body.value, params)


def _scores_meet_only_the_mask(blocks: list[s_tir.SBlock], qk: s_tir.SBlock, mask: tirx.Var) -> bool:
    """Whether every read of q·kᵀ (and of its copies) outside the matmul is ``S + mask``:
    no scale or other op comes between the scores and the mask."""
    scores = [qk.body.buffer]
    users = []
    for block in blocks:
        store = block.body
        if block.same_as(qk) or not isinstance(store, tirx.BufferStore):
            continue
        if store.buffer.same_as(scores[0]) and block.init is None and not _loads(store.value):
            continue  # the matmul's init
        value = store.value
        if isinstance(value, _Load) and any(value.source.same_as(s) for s in scores):
            scores.append(store.buffer)  # a copy (the local accumulator written back)
            continue
        users.append(value)
    for value in users:
        reads = sum(any(ld.source.same_as(s) for s in scores) for ld in _loads(value))
        adds = nodes_in(value, tirx.Add)
        with_mask = sum(
            isinstance(a.a, _Load) and isinstance(a.b, _Load)
            and {_role(a.a, scores, mask), _role(a.b, scores, mask)} == {"S", "M"} for a in adds)
        if reads != with_mask:
            return False
    return True


def _role(load: _Load, scores: list[tirx.Var], mask: tirx.Var) -> str:
    if any(load.source.same_as(s) for s in scores):
        return "S"
    return "M" if load.source.same_as(mask) else "?"


def _find(func: tirx.PrimFunc) -> _Attention | None:
    ports = _ports(func)
    if ports is None or "mask" not in ports:
        return None
    mask = ports["mask"]
    shape = list(mask.ty.shape)
    if len(shape) < 2 or not all(is_one(d) for d in shape[:-2]):
        return None
    rows, keys = shape[-2], shape[-1]
    if not isinstance(rows, tirx.Var) or not isinstance(keys, tirx.Var):
        return None
    blocks = nodes_in(func.body, s_tir.SBlock)
    macs = [(b, found) for b in blocks if (found := _mac(b)) is not None]
    if len(macs) != 2:
        return None
    (qk, (_, qa, kb)), (pv, (_, _, vb)) = macs
    params = list(func.params)
    checks = [_operand(qa, qk, blocks, params), _operand(kb, qk, blocks, params), _operand(vb, pv, blocks, params)]
    if any(c is None for c in checks) or not _scores_meet_only_the_mask(blocks, qk, mask):
        return None
    return _Attention(mask, rows, keys, ports.get("neg_inf"), ports.get("zero"), *checks,
                      dot=qk.iter_vars[-1].dom.extent)


# --- the key_limits block -----------------------------------------------------------------


def _dtype(expr: tirx.Expr) -> str:
    return str(expr.ty.dtype)


def _i64(value: int) -> tirx.Expr:
    return tirx.const(value, "int64")


def _loop(var: tirx.Var, extent: tirx.Expr, body: tirx.Stmt,
          kind: tirx.ForKind = tirx.ForKind.SERIAL) -> tirx.For:
    """``for var in range(extent): body`` with a variable of its own in place of ``var``
    (the block's loops share Python variables; TIR defines each variable once)."""
    own = tirx.Var(var.name, _dtype(var))
    body = tvm_ffi.structural_map(body, [(tirx.Var, lambda v: own if v.same_as(var) else v)])
    return tirx.For(own, tirx.const(0, _dtype(var)), extent, kind, body)


def _lane_width(extent: tirx.Expr, lanes: int) -> int:
    return lanes if isinstance(extent, tirx.IntImm) and extent.value % lanes == 0 else 1


def _largest_magnitude(check: _Check, acc: tirx.Var, lanes: int) -> tirx.Stmt:
    """``acc[l] = max(acc[l], |x| or inf where x is not finite)`` over ``check``'s domain,
    its contiguous iter innermost, in vectors where its extent allows."""
    outer = [(v, e) for v, e in check.domain if check.inner is None or not v.same_as(check.inner)]
    inner_extent = next((e for v, e in check.domain if check.inner is not None and v.same_as(check.inner)), _i64(1))
    width = _lane_width(inner_extent, lanes)
    o, vi, lane = tirx.Var("o", "int64"), tirx.Var("vi", "int64"), tirx.Var("lane", "int64")
    values: dict[tirx.Var, tirx.Expr] = {}
    stride: tirx.Expr = _i64(1)
    for var, extent in reversed(outer):
        values[var] = tirx.Cast(_dtype(var), tirx.floormod(tirx.floordiv(o, stride), tirx.Cast("int64", extent)))
        stride = stride * tirx.Cast("int64", extent)
    if check.inner is not None:
        values[check.inner] = tirx.Cast(_dtype(check.inner), vi * width + lane)
    x = tvm_ffi.structural_map(check.value, [(tirx.Var, lambda v: next((e for k, e in values.items()
                                                                         if k.same_as(v)), v))])
    slot = lane if width > 1 else _i64(0)
    magnitude = tirx.Select(tirx.isfinite(x), tirx.abs(x), tirx.const(float("inf"), "float32"))
    store = tirx.BufferStore(acc, tirx.Max(tirx.BufferLoad(acc, [slot]), magnitude), [slot])
    kind = tirx.ForKind.VECTORIZED if width > 1 else tirx.ForKind.SERIAL
    vectors = tirx.floordiv(tirx.Cast("int64", inner_extent), width)
    return _loop(o, stride, _loop(vi, vectors, _loop(lane, _i64(width), store, kind)))


def _scan_tiles(found: _Attention, limits: tirx.Var, tile_rows: int, chunk: int, lanes: int,
                last: tirx.Var, tile_last: tirx.Var, skips: tirx.Var) -> tirx.Stmt:
    """``limits[t]`` = the keys row tile t needs: the last key some row of it leaves open in
    the mask (not -inf), plus one, rounded up to ``chunk``, at most the key count, at least
    one chunk; ``skips[0]`` = 1 when some tile needs fewer than all keys.  The mask rows in
    vectors of keys."""
    keys = tirx.Cast("int64", found.keys)
    rows = tirx.Cast("int64", found.rows)
    t, r, jo, jt, lane, c = (tirx.Var(n, "int64") for n in ("t", "r", "jo", "jt", "lane", "c"))
    row = t * tile_rows + r
    lead = [_i64(0)] * (len(found.mask.ty.shape) - 2)

    def is_open(key: tirx.Expr) -> tirx.Expr:
        return tirx.BufferLoad(found.mask, [*lead, tirx.Cast(_dtype(found.rows), row),
                                            tirx.Cast(_dtype(found.keys), key)]) != tirx.const(float("-inf"), "float32")

    whole = tirx.floordiv(keys, lanes) * lanes
    scan = tirx.SeqStmt([
        _loop(lane, _i64(lanes), tirx.BufferStore(last, _i64(0), [lane]), tirx.ForKind.VECTORIZED),
        _loop(jo, tirx.floordiv(keys, lanes), _loop(lane, _i64(lanes), tirx.BufferStore(
            last, tirx.Select(is_open(jo * lanes + lane), jo * lanes + lane + 1, tirx.BufferLoad(last, [lane])),
            [lane]), tirx.ForKind.VECTORIZED)),
        _loop(jt, keys - whole, tirx.BufferStore(
            last, tirx.Select(is_open(whole + jt), whole + jt + 1, tirx.BufferLoad(last, [_i64(0)])), [_i64(0)])),
        _loop(c, _i64(lanes), tirx.BufferStore(
            tile_last, tirx.Max(tirx.BufferLoad(tile_last, [_i64(0)]), tirx.BufferLoad(last, [c])), [_i64(0)])),
    ])
    limit = tirx.Min(keys, tirx.floordiv(tirx.BufferLoad(tile_last, [_i64(0)]) + (chunk - 1), chunk) * chunk)
    per_tile = tirx.SeqStmt([
        tirx.BufferStore(tile_last, _i64(1), [_i64(0)]),  # at least one key
        _loop(r, _i64(tile_rows), tirx.IfThenElse(row < rows, scan, None)),
        tirx.BufferStore(limits, limit, [t]),
        tirx.IfThenElse(limit < keys, tirx.BufferStore(skips, tirx.const(1, "int32"), [_i64(0)]), None),
    ])
    return tirx.SeqStmt([tirx.BufferStore(skips, tirx.const(0, "int32"), [_i64(0)]),
                         _loop(t, tirx.floordiv(rows + (tile_rows - 1), tile_rows), per_tile)])


def _skippable(found: _Attention, lanes: int, accs: list[tirx.Var], biggest: tirx.Var) -> tuple[tirx.Stmt, tirx.Expr]:
    """The statements finding the largest |q'|, |k'|, |v| (inf for a value not finite) and
    the condition under which masked keys add nothing (module docstring)."""
    f32, f64 = "float32", "float64"
    lane, c = tirx.Var("lane", "int64"), tirx.Var("c", "int64")
    inf = tirx.const(float("inf"), f32)
    stmts: list[tirx.Stmt] = []
    for acc in accs:
        stmts.append(_loop(lane, _i64(lanes), tirx.BufferStore(acc, tirx.const(0.0, f32), [lane]),
                           tirx.ForKind.VECTORIZED))
    for acc, check in zip(accs, (found.q, found.k, found.v)):
        stmts.append(_largest_magnitude(check, acc, lanes))
    for i, acc in enumerate(accs):
        stmts.append(tirx.BufferStore(biggest, tirx.const(0.0, f32), [_i64(i)]))
        stmts.append(_loop(c, _i64(lanes), tirx.BufferStore(
            biggest, tirx.Max(tirx.BufferLoad(biggest, [_i64(i)]), tirx.BufferLoad(acc, [c])), [_i64(i)])))
    bound = (tirx.Cast(f64, tirx.BufferLoad(biggest, [_i64(0)])) * tirx.Cast(f64, tirx.BufferLoad(biggest, [_i64(1)]))
             * tirx.Cast(f64, found.dot))
    skippable = tirx.all(bound <= tirx.const(SCORE_BOUND, f64), tirx.BufferLoad(biggest, [_i64(2)]) < inf)
    if found.neg_inf is not None:
        skippable = tirx.all(skippable, tirx.BufferLoad(found.neg_inf, []) == -inf)
    if found.zero is not None:
        skippable = tirx.all(skippable, tirx.BufferLoad(found.zero, []) == tirx.const(0.0, f32))
    return tirx.SeqStmt(stmts), skippable


def _key_limits(found: _Attention, limits: tirx.Var, tile_rows: int, chunk: int, lanes: int) -> s_tir.SBlockRealize:
    """The block writing ``limits[t]``, the keys row tile t computes (module docstring):
    the mask scanned first; the values checked only when some tile would skip keys (a mask
    that hides no whole chunk costs the scan alone); every key where a check fails."""
    accs = [tirx.decl_buffer((lanes,), "float32", f"{name}_max", scope="local") for name in ("q", "k", "v")]
    biggest = tirx.decl_buffer((3,), "float32", "biggest", scope="local")
    last = tirx.decl_buffer((lanes,), "int64", "last_open", scope="local")
    tile_last = tirx.decl_buffer((1,), "int64", "tile_last", scope="local")
    skips = tirx.decl_buffer((1,), "int32", "skips", scope="local")
    keys = tirx.Cast("int64", found.keys)
    tiles = tirx.floordiv(tirx.Cast("int64", found.rows) + (tile_rows - 1), tile_rows)
    t = tirx.Var("t", "int64")
    measure, skippable = _skippable(found, lanes, accs, biggest)
    every_key = _loop(t, tiles, tirx.BufferStore(limits, keys, [t]))
    body = tirx.SeqStmt([
        _scan_tiles(found, limits, tile_rows, chunk, lanes, last, tile_last, skips),
        tirx.IfThenElse(tirx.BufferLoad(skips, [_i64(0)]) != 0,
                        tirx.SeqStmt([measure, tirx.IfThenElse(tirx.Not(skippable), every_key, None)]), None),
    ])
    region = tirx.BufferRegion(limits, [ir.Range.from_min_extent(_i64(0), tiles)])
    block = s_tir.SBlock([], [], [region], KEY_LIMITS, body, alloc_buffers=[*accs, biggest, last, tile_last, skips])
    return s_tir.SBlockRealize([], True, block)


# --- the tile loops -----------------------------------------------------------------------


def _key_chunk(extent: tirx.Expr, keys: tirx.Var) -> int | None:
    """c where ``extent`` is ceil(keys / c) (c = 1: keys itself); None for any other form."""
    if extent.same_as(keys):
        return 1
    if isinstance(extent, tirx.FloorDiv) and isinstance(extent.b, tirx.IntImm):
        c = int(extent.b.value)
        if c > 0 and Analyzer().can_prove_equal(extent, tirx.floordiv(keys + (c - 1), c)):
            return c
    return None


def _key_loops(loop: tirx.For, keys: tirx.Var) -> list[tirx.For] | None:
    """The loops under ``loop`` whose extent depends on the key count; None when one is not
    a loop over keys in chunks (``_key_chunk``)."""
    found = [f for f in nodes_in(loop.body, tirx.For) if uses_var(f.extent, keys)]
    if any(_key_chunk(f.extent, keys) is None for f in found):
        return None
    return found


def _realizes(stmt: tirx.Stmt, loops: list[tirx.For], out: list) -> None:
    """Every block realize under ``stmt`` with the loops around it (below ``stmt``)."""
    if isinstance(stmt, tirx.For):
        _realizes(stmt.body, [*loops, stmt], out)
    elif isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            _realizes(s, loops, out)
    elif isinstance(stmt, s_tir.SBlockRealize):
        out.append((stmt, loops))
    elif isinstance(stmt, tirx.IfThenElse):
        _realizes(stmt.then_case, loops, out)
        if stmt.else_case is not None:
            _realizes(stmt.else_case, loops, out)
    elif hasattr(stmt, "body"):
        _realizes(stmt.body, loops, out)


def _first_row(loop: tirx.For) -> tuple[tirx.Expr, int] | None:
    """The first query row a tile iteration computes and the rows per tile, from the
    row iter of a matmul block under ``loop``."""
    realizes: list = []
    _realizes(loop.body, [], realizes)
    for realize, loops in realizes:
        if _mac(realize.block) is None:
            continue
        row = realize.iter_values[-3]
        dom = {f.loop_var: IntervalSet(f.min, f.min + f.extent - 1) for f in loops}
        analyzer = Analyzer()
        span = analyzer.int_set(row, dom)
        lo, hi = analyzer.simplify(span.min_value), analyzer.simplify(span.max_value)
        count = analyzer.simplify(hi - lo + 1)
        if not isinstance(count, tirx.IntImm) or not analyzer.can_prove(tirx.floormod(lo, count) == 0):
            return None
        return lo, int(count.value)
    return None


def _zigzag(loop: tirx.For, tile: tirx.Expr) -> tirx.For:
    """``loop`` running, in place of iteration p, the iteration whose row tile is the
    (p // H)-th of the order 0, T-1, 1, T-2, ... (its tile index ``tile`` = p // H);
    ``loop`` itself when its tile index has another form."""
    p = loop.loop_var
    if not (isinstance(tile, tirx.FloorDiv) and tile.a.same_as(p) and isinstance(tile.b, tirx.IntImm)):
        return loop
    heads = tile.b
    tiles = Analyzer().simplify(tirx.floordiv(loop.extent, heads))
    t = tirx.floordiv(p, heads)
    order = tirx.Select(tirx.floormod(t, 2) == 0, tirx.floordiv(t, 2), tiles - 1 - tirx.floordiv(t, 2))
    moved = order * heads + tirx.floormod(p, heads)
    body = tvm_ffi.structural_map(loop.body, [(tirx.Var, lambda v: moved if v.same_as(p) else v)])
    return tirx.For(p, loop.min, loop.extent, loop.kind, body, loop.thread_binding, loop.annotations)


def _limited(loop: tirx.For, keys: tirx.Var, limit: tirx.Expr) -> tirx.For:
    """``loop`` with every key loop under it stopping at ``limit`` keys."""
    def shorten(inner: tirx.For) -> tirx.For:
        if not uses_var(inner.extent, keys):
            return inner
        extent = tvm_ffi.structural_map(inner.extent, [(tirx.Var, lambda v: limit if v.same_as(keys) else v)])
        return tirx.For(inner.loop_var, inner.min, extent, inner.kind, inner.body, inner.thread_binding,
                        inner.annotations)

    body = tvm_ffi.structural_map(loop.body, [(tirx.For, shorten)])
    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding, loop.annotations)


def skip_masked_keys(func: tirx.PrimFunc, lanes: int) -> tirx.PrimFunc:
    """``func`` (an attention kernel the Attention rule scheduled) with its masked keys
    skipped as the module docstring says; ``func`` itself where that does not apply."""
    found = _find(func)
    root = func.body
    if found is None or not isinstance(root, s_tir.SBlockRealize):
        return func
    top = list(root.block.body.seq) if isinstance(root.block.body, tirx.SeqStmt) else [root.block.body]
    tiles: dict[int, tuple[tirx.Expr, int]] = {}
    chunks = [1]
    for i, stmt in enumerate(top):
        if not isinstance(stmt, tirx.For):
            continue
        key_loops = _key_loops(stmt, found.keys)
        if key_loops is None:
            return func
        if not key_loops:
            continue
        first = _first_row(stmt)
        if first is None:
            return func
        tiles[i] = first
        chunks += [_key_chunk(f.extent, found.keys) for f in key_loops]
    if not tiles or len({rows for _, rows in tiles.values()}) != 1:
        return func
    tile_rows = next(iter(tiles.values()))[1]
    chunk = lcm(*chunks)
    count = tirx.floordiv(tirx.Cast("int64", found.rows) + (tile_rows - 1), tile_rows)
    limits = tirx.decl_buffer((count,), "int64", "key_limit")
    analyzer = Analyzer()
    for i, (first_row, _) in tiles.items():
        loop = top[i]
        tile = analyzer.simplify(tirx.floordiv(first_row, tile_rows))
        limit = tirx.BufferLoad(limits, [tirx.Cast("int64", tile)])
        limit = tirx.Cast(_dtype(found.keys), limit) if _dtype(found.keys) != "int64" else limit
        top[i] = _zigzag(_limited(loop, found.keys, limit), tile)
    pre = _key_limits(found, limits, tile_rows, chunk, lanes)
    block = root.block
    new_root = s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, tirx.SeqStmt([pre, *top]),
                            block.init, [*block.alloc_buffers, limits], block.match_buffers, block.annotations)
    return func.with_body(s_tir.SBlockRealize(root.iter_values, root.predicate, new_root))


__all__ = ["skip_masked_keys"]
