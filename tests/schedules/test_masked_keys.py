"""Masked keys skipped by the attention kernel (``schedules.cpu.masked_keys``): a prompt of
``prompt`` rows after ``total - prompt`` cached keys, a causal mask, symbolic lengths.  The
kernel that skips must give the bits of the kernel that computes every key (NaN where it has
NaN) and numpy's float64 values, also when a masked key holds inf/NaN, a score overflows, a
mask row is fully masked or leaves a key open past the diagonal."""

from __future__ import annotations

import numpy as np
import pytest
import tvm_ffi
from tvm import relax, s_tir, tirx

import aicf_tvm
from schedules.cpu.masked_keys import KEY_LIMITS

from ..conftest import llvm_target
from ..helpers import relax_main

F32 = "float32"
HEADS, KV_HEADS, DIM = 4, 2, 32


def prompt_attention(prompt, total, heads: int = HEADS, kv_heads: int = KV_HEADS, dim: int = DIM):
    """SDPA as ``torch.export`` decomposes it (SDPA's guard included) for ``prompt`` query
    rows over ``total`` keys (a KV cache's), grouped-query k/v, mask ``[1, 1, prompt, total]``."""
    root = float(np.float32(1 / np.sqrt(np.sqrt(dim))))
    params = [relax.Var("q", relax.TensorType((1, prompt, heads * dim), F32)),
              relax.Var("k", relax.TensorType((1, total, kv_heads * dim), F32)),
              relax.Var("v", relax.TensorType((1, total, kv_heads * dim), F32)),
              relax.Var("mask", relax.TensorType((1, 1, prompt, total), F32))]
    op = relax.op

    def body(bb, q, k, v, mask):
        def heads_of(x, rows, n):
            x = bb.emit(op.permute_dims(bb.emit(op.reshape(x, (1, rows, n, dim))), [0, 2, 1, 3]))
            if n == heads:
                return x
            x = bb.emit(op.broadcast_to(bb.emit(op.expand_dims(x, [2])), (1, n, heads // n, rows, dim)))
            return bb.emit(op.reshape(x, (1, heads, rows, dim)))

        scale = relax.const(root, F32)
        qs = bb.emit(op.multiply(heads_of(q, prompt, heads), scale))
        kt = bb.emit(op.multiply(bb.emit(op.permute_dims(heads_of(k, total, kv_heads), [0, 1, 3, 2])), scale))
        s = bb.emit(op.add(bb.emit(op.matmul(qs, kt)), mask))
        p = bb.emit(op.nn.softmax(s, axis=-1))
        kept = bb.emit(op.logical_not(bb.emit(op.equal(s, relax.const(float("-inf"), F32)))))
        any_kept = bb.emit(op.max(bb.emit(op.astype(kept, "int8")), axis=[-1], keepdims=True))
        none_kept = bb.emit(op.logical_not(bb.emit(op.astype(any_kept, "bool"))))
        p = bb.emit(op.where(none_kept, relax.const(0.0, F32), p))
        o = bb.emit(op.permute_dims(bb.emit(op.matmul(p, heads_of(v, total, kv_heads))), [0, 2, 1, 3]))
        return op.reshape(o, (1, prompt, heads * dim))

    return relax_main(params, body)


def reference(q, k, v, mask) -> np.ndarray:
    """float64 numpy; a row whose scores are all -inf gives 0 (SDPA's guard)."""
    prompt, total = q.shape[1], k.shape[1]

    def heads_of(x, rows, n):
        x = x.astype(np.float64).reshape(1, rows, n, DIM).transpose(0, 2, 1, 3)
        return np.repeat(x, HEADS // n, axis=1)

    s = heads_of(q, prompt, HEADS) @ heads_of(k, total, KV_HEADS).transpose(0, 1, 3, 2) / np.sqrt(DIM) + mask
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(s - s.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
        p = np.where(np.isneginf(s).all(-1, keepdims=True), 0.0, p)
        return (p @ heads_of(v, total, KV_HEADS)).transpose(0, 2, 1, 3).reshape(1, prompt, HEADS * DIM)


def causal(prompt: int, total: int) -> np.ndarray:
    past = total - prompt
    seen = np.arange(total)[None, :] <= np.arange(prompt)[:, None] + past
    return np.where(seen, 0.0, -np.inf).astype(F32).reshape(1, 1, prompt, total)


@pytest.fixture(scope="module")
def kernels():
    """The same attention compiled with and without skipping (symbolic prompt and total)."""
    prompt, total = tirx.Var("prompt", "int64"), tirx.Var("total", "int64")
    mod = prompt_attention(prompt, total)
    return {skip: aicf_tvm.compile(mod, target=llvm_target(),
                                   options=aicf_tvm.CompileOptions(attention_skip_masked=skip))
            for skip in (True, False)}


def _attention_kernel(compiled) -> tirx.PrimFunc:
    funcs = [f for gv, f in compiled.lowered.functions_items() if isinstance(f, tirx.PrimFunc)
             and f.attrs is not None and f.attrs.get("aicf.schedule") == "Attention"]
    assert len(funcs) == 1
    return funcs[0]


def _has_key_limits(func: tirx.PrimFunc) -> bool:
    names: list[str] = []
    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, lambda b: names.append(b.name_hint))])
    return KEY_LIMITS in names


def _operands(rand, prompt: int, total: int) -> list[np.ndarray]:
    return [rand(1, prompt, HEADS * DIM), rand(1, total, KV_HEADS * DIM), rand(1, total, KV_HEADS * DIM),
            causal(prompt, total)]


def _same_results(kernels, args, float64_reference: bool = True) -> np.ndarray:
    """The skipping kernel's output, checked against the full one (bits, NaN where it has
    NaN) and numpy (values; not where float32 scores overflow and float64 ones do not)."""
    got, full = (np.asarray(kernels[skip](*args)) for skip in (True, False))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(full))
    np.testing.assert_array_equal(np.where(np.isnan(got), 0, got).view(np.uint32),
                                  np.where(np.isnan(full), 0, full).view(np.uint32))
    if not float64_reference:
        return got
    want = reference(*args)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-5, atol=2e-6)
    return got


def test_the_kernel_checks_and_limits_its_keys_only_where_asked(kernels):
    assert _has_key_limits(_attention_kernel(kernels[True]))
    assert not _has_key_limits(_attention_kernel(kernels[False]))


# prompt rows x total keys: one row; fewer rows than a tile; row and key tails; a prompt
# after cached keys; the whole cache a prompt
LENGTHS = [(1, 1), (1, 40), (5, 5), (8, 40), (37, 100), (64, 64), (100, 300), (131, 131)]


@pytest.mark.parametrize("prompt, total", LENGTHS, ids=[f"p{p}t{t}" for p, t in LENGTHS])
def test_causal_prompts_give_the_bits_of_every_key_computed(kernels, rand, prompt, total):
    _same_results(kernels, _operands(rand, prompt, total))


def _masked_v_inf(q, k, v, mask):
    v[0, 90, 3] = np.inf  # key 90: masked for rows before it, read by the rows after
    return q, k, v, mask


def _masked_k_nan(q, k, v, mask):
    k[0, 95, 7] = np.nan
    return q, k, v, mask


def _overflowing_scores(q, k, v, mask):
    q[0, 4, :DIM] = 1e20  # row 4 (head 0) meets key 90, masked for it, in a score of +inf
    k[0, 90, :DIM] = 1e20
    return q, k, v, mask


def _padding_and_masked_rows(q, k, v, mask):
    mask[..., 3] = -np.inf  # a padded key
    mask[..., 50, :] = -np.inf  # a row that sees nothing: SDPA's guard gives 0
    return q, k, v, mask


def _open_past_the_diagonal(q, k, v, mask):
    mask[..., 2, 97] = 0.0  # row 2 also sees key 97: its tile computes up to it
    mask[..., 60, 70:] = 0.0
    return q, k, v, mask


def _nan_in_the_mask(q, k, v, mask):
    mask[..., 20, 90] = np.nan
    return q, k, v, mask


def _nothing_masked(q, k, v, mask):
    mask[...] = 0.0  # every key open: nothing to skip, the values unchecked
    v[0, 90, 3] = np.inf
    return q, k, v, mask


INPUTS = [_masked_v_inf, _masked_k_nan, _overflowing_scores, _padding_and_masked_rows, _open_past_the_diagonal,
          _nan_in_the_mask, _nothing_masked]


@pytest.mark.parametrize("change", INPUTS, ids=[f.__name__.strip("_") for f in INPUTS])
def test_inputs_that_make_masked_keys_count_are_computed_in_full(kernels, rand, change):
    """Where a masked key is not finite, a score overflows, or the mask opens a key past
    the diagonal, the check or the scan sees it and the rows get what every key gives."""
    overflow = change is _overflowing_scores
    got = _same_results(kernels, list(change(*_operands(rand, 100, 100))), float64_reference=not overflow)
    if change is _masked_v_inf:
        assert np.isnan(got[0, :90, :]).any()  # 0·inf at the masked key: NaN, as the graph says
    if overflow:  # +inf at a masked key: inf + -inf = NaN, row 4 NaN in float32
        assert np.isnan(got[0, 4, :DIM]).all() and not np.isnan(got[0, 5]).any()


def test_static_lengths_and_one_row_keep_the_kernel_as_scheduled(rand):
    """Constant lengths (the one-pass kernel) and a one-row step (a decode) have nothing to
    skip here: no check block."""
    for prompt, total in ((64, 64), (1, tirx.Var("total", "int64"))):
        compiled = aicf_tvm.compile(prompt_attention(prompt, total), target=llvm_target())
        assert not _has_key_limits(_attention_kernel(compiled))
