"""GroupQueryHeads: a one-row grouped-query attention computed per key/value head, with
the bits of the graph as written; and the fused attention of a mask that broadcasts over
the query rows."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, tirx

import aicf_tvm
from relax_passes.group_query_heads import GroupQueryHeads

from ..conftest import llvm_target
from ..helpers import relax_main

F32 = "float32"


def attention(rows, keys, heads: int, kv_heads: int, dim: int, mask_rows=None) -> tvm.IRModule:
    """``main(q [1, rows, heads * dim], k [1, kv_heads, keys, dim], v (same), mask
    [1, 1, mask_rows, keys])`` as transformers' SDPA path exports it: the heads split,
    ``repeat_kv`` of k and v, √scale on q and kᵀ, the mask, softmax with the all-masked
    guard. ``keys`` may be a ``tirx.Var``; ``mask_rows`` defaults to ``rows``."""
    op, group = relax.op, heads // kv_heads
    mask_rows = rows if mask_rows is None else mask_rows
    params = [relax.Var("q", relax.TensorType((1, rows, heads * dim), F32)),
              relax.Var("k", relax.TensorType((1, kv_heads, keys, dim), F32)),
              relax.Var("v", relax.TensorType((1, kv_heads, keys, dim), F32)),
              relax.Var("mask", relax.TensorType((1, 1, mask_rows, keys), F32))]
    root = relax.const(float(np.float32(1 / np.sqrt(np.sqrt(dim)))), F32)

    def body(bb, q, k, v, mask):
        def repeat(x):
            if group == 1:
                return x
            x = bb.emit(op.broadcast_to(bb.emit(op.expand_dims(x, [2])), (1, kv_heads, group, keys, dim)))
            return bb.emit(op.reshape(x, (1, heads, keys, dim)))

        qh = bb.emit(op.permute_dims(bb.emit(op.reshape(q, (1, rows, heads, dim))), [0, 2, 1, 3]))
        qs = bb.emit(op.multiply(qh, root))
        kt = bb.emit(op.multiply(bb.emit(op.permute_dims(repeat(k), [0, 1, 3, 2])), root))
        s = bb.emit(op.add(bb.emit(op.matmul(qs, kt)), mask))
        p = bb.emit(op.nn.softmax(s, axis=-1))
        kept = bb.emit(op.logical_not(bb.emit(op.equal(s, relax.const(float("-inf"), F32)))))
        any_kept = bb.emit(op.max(bb.emit(op.astype(kept, "int8")), axis=[-1], keepdims=True))
        p = bb.emit(op.where(bb.emit(op.logical_not(bb.emit(op.astype(any_kept, "bool")))),
                             relax.const(0.0, F32), p))
        o = bb.emit(op.permute_dims(bb.emit(op.matmul(p, repeat(v))), [0, 2, 1, 3]))
        return op.reshape(o, (1, rows, heads * dim))

    return relax_main(params, body)


def reference(q, k, v, mask, heads: int, dim: int) -> np.ndarray:
    """float64 numpy; a row whose scores are all -inf gives 0."""
    rows, group = q.shape[1], heads // k.shape[1]
    qh = q.astype(np.float64).reshape(1, rows, heads, dim).transpose(0, 2, 1, 3)
    kh, vh = (np.repeat(x.astype(np.float64), group, axis=1) for x in (k, v))
    s = qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(dim) + mask
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(-1, keepdims=True))
        p = np.where(np.isneginf(s).all(-1, keepdims=True), 0.0, e / e.sum(-1, keepdims=True))
    return (p @ vh).transpose(0, 2, 1, 3).reshape(1, rows, heads * dim)


def operands(seed: int, rows: int, keys: int, heads: int, kv_heads: int, dim: int, mask_rows: int | None = None):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, rows, heads * dim)).astype(F32)
    k, v = (rng.standard_normal((1, kv_heads, keys, dim)).astype(F32) for _ in range(2))
    mask = np.where(rng.random((1, 1, rows if mask_rows is None else mask_rows, keys)) < 0.2, -np.inf, 0)
    return [q, k, v, mask.astype(F32)]


def _matmul_rows(mod: tvm.IRModule) -> list[int]:
    """The row count (second-to-last output dim) of every matmul in ``main``."""
    out = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.matmul":
                out.append(int(b.var.ty.shape.values[-2]))
    return out


def _compile(mod: tvm.IRModule, grouped: bool) -> aicf_tvm.CompiledModel:
    return aicf_tvm.compile(mod, target=llvm_target(),
                            options=aicf_tvm.CompileOptions(group_query_heads=grouped))


@pytest.mark.parametrize("keys", [1, 37, 256, "symbolic"])
@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 2), (6, 3)])
def test_one_row_per_head_runs_per_kv_head_with_the_same_bits(keys, heads, kv_heads):
    """A decode step's attention: the pass makes each matmul one row per query head of a
    kv head (G rows), and the build equals the ungrouped one bit for bit, and numpy;
    one fused attention kernel, scheduled by the attention rule (also ungrouped: a tile of
    one query row whose row loop ``compute_at`` dropped)."""
    dim = 32
    symbolic = keys == "symbolic"
    mod = attention(1, tirx.Var("total", "int64") if symbolic else keys, heads, kv_heads, dim)
    assert _matmul_rows(GroupQueryHeads()(mod)) == [heads // kv_heads] * 2
    grouped, plain = _compile(mod, True), _compile(mod, False)
    for compiled in (grouped, plain) if keys != 1 else (grouped,):  # (plain: a tile of one row too)
        assert [(k.kind, k.schedule) for k in compiled.kernels] == [("fused_attention", "Attention")]
    inputs = [operands(seed, 1, n, heads, kv_heads, dim) for seed, n in ((0, 45 if symbolic else keys), (1, 9))]
    outs = []
    for args in inputs[: 2 if symbolic else 1]:
        got = np.asarray(grouped(*args))
        np.testing.assert_array_equal(got, np.asarray(plain(*args)))
        np.testing.assert_allclose(got, reference(*args, heads, dim), rtol=2e-5, atol=2e-6)
        outs.append(got)
    if symbolic:
        assert outs[0].shape == outs[1].shape and not np.array_equal(outs[0], outs[1])


def test_nan_inf_and_masked_rows_keep_their_bits():
    """NaN and infinite keys and values, and a kv group whose every key is masked: the
    grouped build gives the ungrouped build's bits (NaN where they are, the guard's
    zeros for the masked rows)."""
    heads, kv_heads, dim, keys = 8, 2, 16, 40
    mod = attention(1, keys, heads, kv_heads, dim)
    q, k, v, mask = operands(3, 1, keys, heads, kv_heads, dim)
    k[0, 0, 5, 3] = np.nan
    v[0, 0, 7, :] = np.inf  # kv head 0 (query heads 0-3) only: kv head 1's heads stay finite
    v[0, 0, 8, 2] = -np.inf
    q[0, 0, 3 * dim + 1] = np.inf
    grouped, plain = _compile(mod, True), _compile(mod, False)
    got = np.asarray(grouped(q, k, v, mask))
    np.testing.assert_array_equal(got, np.asarray(plain(q, k, v, mask)))  # NaN positions too
    assert np.isnan(got).any() and np.isfinite(got).any()
    clean = operands(5, 1, keys, heads, kv_heads, dim)
    clean[3][...] = -np.inf  # every key masked: the guard's zeros
    got = np.asarray(grouped(*clean))
    np.testing.assert_array_equal(got, np.asarray(plain(*clean)))
    assert (got == 0).all()


def test_prompt_rows_and_ungrouped_heads_stay_as_written():
    """Several query rows (a prompt), or as many kv heads as query heads: nothing to group."""
    for mod in (attention(5, 16, 8, 2, 16), attention(1, 16, 4, 4, 16)):
        assert tvm_ffi.structural_equal(GroupQueryHeads()(mod), mod)


@pytest.mark.parametrize("rows", [1, 7, 33])
def test_a_mask_broadcast_over_the_query_rows_fuses_and_matches_numpy(rows):
    """A padding mask ``[1, 1, 1, keys]`` (the same for every query row) joins the fused
    attention, with every query row reading it."""
    heads, dim, keys = 4, 16, 29
    mod = attention(rows, keys, heads, heads, dim, mask_rows=1)
    compiled = _compile(mod, True)
    assert [(k.kind, k.schedule) for k in compiled.kernels] == [("fused_attention", "Attention")]
    args = operands(4, rows, keys, heads, heads, dim, mask_rows=1)
    np.testing.assert_allclose(np.asarray(compiled(*args)), reference(*args, heads, dim), rtol=2e-5, atol=2e-6)
