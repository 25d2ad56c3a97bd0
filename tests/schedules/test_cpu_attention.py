"""CPU Attention rule: fused attention kernels of odd and symbolic lengths, head dims 8 to
128, with and without a mask and SDPA's all-masked-row guard, grouped-query k/v.

Each case is a written-out SDPA (head split, √scale on q and on kᵀ, mask add, softmax,
guard, head merge) compiled by ``aicf_tvm.compile``; it must be one ``fused_attention``
kernel scheduled by ``Attention``, and its output must match numpy (the math, a fully
masked row giving 0) and, where PyTorch is installed, ``scaled_dot_product_attention``.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx

import aicf_tvm
from aicf_tvm.runtime.targets import resolve_target
from schedules import apply_default_schedules, default_rules
from schedules.cpu import Attention
from schedules.cpu.attention_analysis import plan_attention
from schedules.cpu.common import float32_lanes, is_one, vector_registers

from ..conftest import llvm_target
from ..helpers import relax_main
from .test_cpu_reduction import prim_funcs, relax_module, run

F32 = "float32"


def sdpa(seq, heads: int, dim: int, kv_heads: int | None = None, mask: bool = True,
         guard: bool = True, batch: int = 1) -> tvm.IRModule:
    """SDPA as ``torch.export`` decomposes it; ``seq`` may be a ``tirx.Var``.  The mask,
    ``[1, 1, seq, seq]``, broadcasts over the batch and the heads."""
    kv_heads = kv_heads or heads
    root = float(np.float32(1 / np.sqrt(np.sqrt(dim))))
    params = [relax.Var(name, relax.TensorType((batch, seq, width * dim), F32))
              for name, width in (("q", heads), ("k", kv_heads), ("v", kv_heads))]
    if mask:
        params.append(relax.Var("mask", relax.TensorType((1, 1, seq, seq), F32)))
    op = relax.op

    def body(bb, q, k, v, *maybe_mask):
        def heads_of(x, n):
            x = bb.emit(op.permute_dims(bb.emit(op.reshape(x, (batch, seq, n, dim))), [0, 2, 1, 3]))
            if n == heads:
                return x
            x = bb.emit(op.broadcast_to(bb.emit(op.expand_dims(x, [2])), (batch, n, heads // n, seq, dim)))
            return bb.emit(op.reshape(x, (batch, heads, seq, dim)))  # repeat_kv

        scale = relax.const(root, F32)
        qs = bb.emit(op.multiply(heads_of(q, heads), scale))
        kt = bb.emit(op.multiply(bb.emit(op.permute_dims(heads_of(k, kv_heads), [0, 1, 3, 2])), scale))
        s = bb.emit(op.matmul(qs, kt))
        for m in maybe_mask:
            s = bb.emit(op.add(s, m))
        p = bb.emit(op.nn.softmax(s, axis=-1))
        if guard:
            kept = bb.emit(op.logical_not(bb.emit(op.equal(s, relax.const(float("-inf"), F32)))))
            any_kept = bb.emit(op.max(bb.emit(op.astype(kept, "int8")), axis=[-1], keepdims=True))
            none_kept = bb.emit(op.logical_not(bb.emit(op.astype(any_kept, "bool"))))
            p = bb.emit(op.where(none_kept, relax.const(0.0, F32), p))
        o = bb.emit(op.permute_dims(bb.emit(op.matmul(p, heads_of(v, kv_heads))), [0, 2, 1, 3]))
        return op.reshape(o, (batch, seq, heads * dim))

    return relax_main(params, body)


def reference(q, k, v, mask, heads: int, dim: int) -> np.ndarray:
    """The math in numpy (float64); a row whose scores are all -inf gives 0."""
    batch, seq, kv_heads = q.shape[0], q.shape[1], k.shape[2] // dim

    def heads_of(x, n):
        x = x.astype(np.float64).reshape(batch, seq, n, dim).transpose(0, 2, 1, 3)
        return np.repeat(x, heads // n, axis=1)

    s = heads_of(q, heads) @ heads_of(k, kv_heads).transpose(0, 1, 3, 2) / np.sqrt(dim)
    if mask is not None:
        s = s + mask
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
    p = np.where(np.isneginf(s).all(-1, keepdims=True), 0.0, p)
    return (p @ heads_of(v, kv_heads)).transpose(0, 2, 1, 3).reshape(batch, seq, heads * dim)


def causal_mask(seq: int, masked_row: int | None = None) -> np.ndarray:
    mask = np.where(np.tril(np.ones((seq, seq), bool)), 0, -np.inf).astype(F32)
    if masked_row is not None:
        mask[masked_row, :] = -np.inf  # sees nothing: SDPA's guard gives 0, softmax NaN
    return mask.reshape(1, 1, seq, seq)


def operands(rand, seq: int, heads: int, dim: int, kv_heads: int, batch: int = 1) -> list[np.ndarray]:
    widths = (heads, kv_heads, kv_heads)
    return [rand(batch, seq, width * dim) for width in widths]


def compile_attention(mod: tvm.IRModule, target: tvm.target.Target | None = None,
                      options: aicf_tvm.CompileOptions | None = None) -> aicf_tvm.CompiledModel:
    compiled = aicf_tvm.compile(mod, target=target or llvm_target(), options=options)
    assert [(k.kind, k.schedule) for k in compiled.kernels] == [("fused_attention", "Attention")]
    return compiled


def numpy_of(value) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else value


# seq, heads, head dim, kv heads, batch: odd lengths (tails in rows and keys), one query
# row, head dims from 8 to 128 (80: five vectors), grouped-query k/v, two sequences, and
# a 7x7 window's 49 tokens (tiles of 7 rows).
CASES = [(1, 2, 32, 2, 1), (7, 2, 80, 2, 1), (100, 2, 128, 2, 1), (197, 2, 64, 2, 1), (384, 1, 64, 1, 1),
         (33, 4, 16, 2, 1), (128, 2, 8, 1, 1), (21, 2, 32, 2, 2), (49, 3, 32, 3, 2)]


@pytest.mark.parametrize("seq, heads, dim, kv_heads, batch", CASES,
                         ids=[f"s{c[0]}d{c[2]}kv{c[3]}b{c[4]}" for c in CASES])
def test_causal_attention_with_a_fully_masked_row_matches_numpy(rand, seq, heads, dim, kv_heads, batch):
    compiled = compile_attention(sdpa(seq, heads, dim, kv_heads, batch=batch))
    masked = seq // 2 if seq > 2 else None
    args = [*operands(rand, seq, heads, dim, kv_heads, batch), causal_mask(seq, masked_row=masked)]
    got = numpy_of(compiled(*args))
    np.testing.assert_allclose(got, reference(*args, heads, dim), rtol=2e-5, atol=2e-6)
    if masked is not None:
        np.testing.assert_array_equal(got[:, masked], 0)


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "softmax"])
def test_attention_without_a_mask_matches_numpy(rand, guard):
    """ViT's shape family: no mask, 197 tokens (a prime: every tile and vector has a tail)."""
    compiled = compile_attention(sdpa(197, 2, 64, mask=False, guard=guard))
    args = operands(rand, 197, 2, 64, 2)
    np.testing.assert_allclose(numpy_of(compiled(*args)), reference(*args, None, 2, 64), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("seq", [37, 48], ids=["key_tail", "whole_vectors"])
def test_nan_and_infinite_inputs_reach_the_rows_they_touch(rand, seq):
    """A NaN in one query makes that row NaN (each head), a +inf mask entry makes its row
    NaN (inf - inf), a row masked with -inf everywhere is 0; the other rows stay finite.
    The row max is taken over vector lanes either way: 37 keys after padding them to 48
    with repeated keys (``whole_vectors.pad_max``)."""
    heads, dim = 2, 32
    compiled = compile_attention(sdpa(seq, heads, dim))
    q, k, v = operands(rand, seq, heads, dim, heads)
    q[0, 3, 5] = np.nan
    mask = causal_mask(seq, masked_row=20)
    mask[0, 0, 9, 2] = np.inf
    got, want = numpy_of(compiled(q, k, v, mask)), reference(q, k, v, mask, heads, dim)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[0, 3, :dim]).all() and np.isnan(got[0, 9]).all()
    np.testing.assert_array_equal(got[0, 20], 0)
    finite = ~np.isnan(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("seq, mask", [(197, False), (37, True)], ids=["vit", "masked"])
def test_row_maxes_at_a_key_tail_take_vector_lanes_with_the_same_bits(rand, seq, mask):
    """At a key count that is not a whole number of vectors, the softmax's max runs per
    vector lane (an ``_rf`` block, the lanes vectorized; the guard's int8 max stays serial)
    and the output has the bits of the kernel whose max runs serially over the keys (the
    rule without ``pad_max``): a max is exact in any order and ignores the repeated keys."""
    mod = sdpa(seq, 2, 64, mask=mask)
    compiled = compile_attention(mod)
    [func] = [f for f in compiled.lowered.functions.values() if isinstance(f, tirx.PrimFunc)]
    sch = s_tir.Schedule(func)
    lane_blocks = [b for b in _all_blocks(sch) if sch.get(b).name_hint.endswith("_rf_update")]
    assert [sch.get(b).name_hint for b in lane_blocks] == ["T_softmax_maxelem_rf_update"]
    assert sch.get(sch.get_loops(lane_blocks[0])[-1]).kind == tirx.ForKind.VECTORIZED

    serial = compile_attention(mod, options=aicf_tvm.CompileOptions(attention_lane_max=False))
    [func] = [f for f in serial.lowered.functions.values() if isinstance(f, tirx.PrimFunc)]
    sch = s_tir.Schedule(func)
    assert not any(sch.get(b).name_hint.endswith("_rf_update") for b in _all_blocks(sch))
    args = operands(rand, seq, 2, 64, 2)
    if mask:
        args.append(causal_mask(seq, masked_row=seq // 2))
        args[0][0, 3, 5] = np.nan
    got, want = numpy_of(compiled(*args)), numpy_of(serial(*args))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    math = reference(*args, 2, 64) if mask else reference(*args, None, 2, 64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(math))
    np.testing.assert_allclose(got[~np.isnan(got)], math[~np.isnan(got)], rtol=2e-5, atol=2e-6)


def _parallel_loops(func: tirx.PrimFunc) -> list[list[str]]:
    """Per parallel loop of ``func``, the names of the blocks under it."""
    out = []

    def visit(loop: tirx.For) -> None:
        if loop.kind == tirx.ForKind.PARALLEL:
            names = []
            tvm_ffi.structural_walk(loop.body, [(s_tir.SBlock, lambda b: names.append(b.name_hint))])
            out.append(names)

    tvm_ffi.structural_walk(func.body, [(tirx.For, visit)])
    return out


def _matmuls(names: list[str]) -> int:
    return sum(name.startswith("matmul") and name.endswith("_update") for name in names)


def _host_target() -> tvm.target.Target:
    """This machine's CPU (AVX-512 here and in CI), as ``compile(target="llvm")`` sees it."""
    return resolve_target("llvm")


@pytest.mark.parametrize("seq, masked, target", [(64, True, llvm_target), (96, False, llvm_target),
                                                 (64, True, _host_target)],
                         ids=["causal", "no_mask", "host_cpu"])
def test_whole_key_tiles_run_in_one_pass_with_the_bits_of_two(rand, seq, masked, target):
    """At a key count of whole register tiles q·kᵀ runs inside the tile loop of the softmax
    and p·v (one parallel loop holds both matmuls), kᵀ is packed in panels of a tile's keys
    (``[b, keys / width, k, width]``), and the output has the bits of the rule's two passes
    over a row-major kᵀ: the same sums in the same order, only where they run changes."""
    heads, dim = 3, 64
    mod = sdpa(seq, heads, dim, mask=masked)
    compiled = compile_attention(mod, target())
    [func] = [f for f in compiled.lowered.functions.values() if isinstance(f, tirx.PrimFunc)]
    loops = _parallel_loops(func)
    assert max(map(_matmuls, loops)) == 2, loops
    plan = plan_attention(seq, seq, dim, float32_lanes(target()), vector_registers(target()))
    width = plan.key_width
    shapes = []
    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, lambda b: shapes.extend(
        [int(d) for d in buf.shape] for buf in b.alloc_buffers))])
    assert [1, heads, seq // width, dim, width] in shapes, shapes

    two = compile_attention(mod, target(), options=aicf_tvm.CompileOptions(attention_one_pass=False))
    [func] = [f for f in two.lowered.functions.values() if isinstance(f, tirx.PrimFunc)]
    assert max(map(_matmuls, _parallel_loops(func))) == 1
    args = operands(rand, seq, heads, dim, heads)
    if masked:
        args.append(causal_mask(seq, masked_row=seq // 3))
        args[1][0, 7, 2] = np.inf  # key 7: NaN scores in the rows that see it
    got, want = numpy_of(compiled(*args)), numpy_of(two(*args))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    math = reference(*args, heads, dim) if masked else reference(*args, None, heads, dim)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(math))
    np.testing.assert_allclose(got[~np.isnan(got)], math[~np.isnan(got)], rtol=2e-5, atol=2e-6)


def _haswell() -> tvm.target.Target:
    return tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell", "num-cores": 2})


@pytest.mark.parametrize("seq, masked, target", [(197, False, _host_target), (90, True, _host_target),
                                                 (1500, False, _host_target), (45, True, _haswell),
                                                 (197, True, _haswell)],
                         ids=["vit_host", "vector_and_tail_host", "whisper_host", "avx2_tail", "avx2_vit"])
def test_keys_of_no_whole_tiles_run_in_one_pass_with_the_bits_of_two(rand, seq, masked, target):
    """A constant key count past one register tile but no whole number of them (ViT's 197,
    Whisper's 1500): q·kᵀ runs in the softmax's tile loop too, its keys cut into whole
    tiles, whole vectors and a tail under a vector; the output has the bits of the two-pass
    build (the same sums in the same order) and matches float64 numpy."""
    heads, dim = 2, 64
    mod = sdpa(seq, heads, dim, mask=masked)
    compiled = compile_attention(mod, target())
    [plan] = [k.plan for k in compiled.kernels]
    assert "one pass" in plan, plan
    two = compile_attention(mod, target(), options=aicf_tvm.CompileOptions(attention_one_pass_tail=False))
    assert "two passes" in two.kernels[0].plan
    [func] = [f for f in compiled.lowered.functions.values() if isinstance(f, tirx.PrimFunc)]
    assert max(map(_matmuls, _parallel_loops(func))) >= 3  # p·v and q·kᵀ's parts in one loop
    args = operands(rand, seq, heads, dim, heads)
    if masked:
        args.append(causal_mask(seq, masked_row=seq // 3))
        args[1][0, seq - 2, 1] = np.inf  # a key in the tail: NaN scores in the rows that see it
    got, want = numpy_of(compiled(*args)), numpy_of(two(*args))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    math = reference(*args, heads, dim) if masked else reference(*args, None, heads, dim)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(math))
    np.testing.assert_allclose(got[~np.isnan(got)], math[~np.isnan(got)], rtol=2e-5, atol=2e-6)


def test_grouped_query_attention_matches_torch_sdpa(rand):
    torch = pytest.importorskip("torch")
    seq, heads, dim, kv_heads = 45, 4, 32, 2
    compiled = compile_attention(sdpa(seq, heads, dim, kv_heads))
    q, k, v = operands(rand, seq, heads, dim, kv_heads)
    mask = causal_mask(seq)
    mask[0, 0, :, -3:] = -np.inf  # padding: the last three keys
    got = numpy_of(compiled(q, k, v, mask))

    def heads_of(x):
        return torch.from_numpy(x).reshape(1, seq, -1, dim).transpose(1, 2)

    want = torch.nn.functional.scaled_dot_product_attention(
        heads_of(q), heads_of(k), heads_of(v), attn_mask=torch.from_numpy(mask), enable_gqa=True)
    np.testing.assert_allclose(got, want.transpose(1, 2).reshape(1, seq, -1).numpy(), rtol=2e-5, atol=2e-6)


def test_symbolic_sequence_length_is_one_kernel_for_every_length(rand):
    seq = tirx.Var("seq", "int64")
    compiled = compile_attention(sdpa(seq, 2, 64))
    for length in (1, 7, 100):
        args = [*operands(rand, length, 2, 64, 2), causal_mask(length)]
        np.testing.assert_allclose(numpy_of(compiled(*args)), reference(*args, 2, 64), rtol=2e-5, atol=2e-6)


def test_symbolic_batch_and_length_match_numpy_with_nan_and_masked_rows(rand):
    """One kernel for every (batch, seq), grouped-query k/v, in both layouts (``sdpa``, and
    ``head_major_gqa`` over the merged batch x heads axis): lengths with key tails (1, 17,
    33, 100), a NaN query, a +inf mask entry and a fully masked row, against numpy."""
    batch, seq = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    heads, dim, kv_heads = 4, 32, 2
    compiled = compile_attention(sdpa(seq, heads, dim, kv_heads, batch=batch))
    merged = compile_attention(head_major_gqa(batch, seq, heads, kv_heads, dim))
    for b, length in ((1, 1), (1, 17), (2, 33), (3, 100)):
        q, k, v = operands(rand, length, heads, dim, kv_heads, b)
        mask = causal_mask(length, masked_row=length // 2 if length > 2 else None)
        if length > 9:
            q[-1, 3, 5] = np.nan
            mask[0, 0, 9, 2] = np.inf
        want = reference(q, k, v, mask, heads, dim)
        head_major = [x.reshape(b, length, -1, dim).transpose(0, 2, 1, 3).copy() for x in (q, k, v)]
        for got in (compiled(q, k, v, mask), merged(*head_major, np.repeat(mask, b, axis=0))):
            got = numpy_of(got)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            finite = ~np.isnan(want)
            np.testing.assert_allclose(got[finite], want[finite], rtol=2e-5, atol=2e-6)


def head_major_gqa(batch, seq, heads: int, kv_heads: int, dim: int) -> tvm.IRModule:
    """LLaMA's attention as ``torch.export`` decomposes SDPA: q ``[b, heads, seq, d]``, k
    and v ``[b, kv_heads, seq, d]`` repeated per group (``repeat_kv``), both matmuls over
    the merged ``b * heads`` axis, a ``[b, 1, seq, seq]`` mask, SDPA's guard, the heads
    merged."""
    params = [relax.Var("q", relax.TensorType((batch, heads, seq, dim), F32)),
              relax.Var("k", relax.TensorType((batch, kv_heads, seq, dim), F32)),
              relax.Var("v", relax.TensorType((batch, kv_heads, seq, dim), F32)),
              relax.Var("mask", relax.TensorType((batch, 1, seq, seq), F32))]
    op, group = relax.op, heads // kv_heads
    root = relax.const(float(np.float32(1 / np.sqrt(np.sqrt(dim)))), F32)

    def body(bb, q, k, v, mask):
        def repeat(x):
            x = bb.emit(op.broadcast_to(bb.emit(op.expand_dims(x, [2])), (batch, kv_heads, group, seq, dim)))
            return bb.emit(op.reshape(x, (batch, heads, seq, dim)))

        def merged(x, *dims):
            return bb.emit(op.reshape(x, (batch * heads, *dims)))

        kt = bb.emit(op.multiply(bb.emit(op.permute_dims(repeat(k), [0, 1, 3, 2])), root))
        scores = bb.emit(op.matmul(merged(bb.emit(op.multiply(q, root)), seq, dim), merged(kt, dim, seq)))
        s = bb.emit(op.add(bb.emit(op.reshape(scores, (batch, heads, seq, seq))), mask))
        kept = bb.emit(op.logical_not(bb.emit(op.equal(s, relax.const(float("-inf"), F32)))))
        none_kept = bb.emit(op.logical_not(bb.emit(op.astype(
            bb.emit(op.max(bb.emit(op.astype(kept, "int8")), axis=[-1], keepdims=True)), "bool"))))
        p = bb.emit(op.where(none_kept, relax.const(0.0, F32), bb.emit(op.nn.softmax(s, axis=-1))))
        o = bb.emit(op.reshape(bb.emit(op.matmul(merged(p, seq, seq), merged(repeat(v), seq, dim))),
                               (batch, heads, seq, dim)))
        return op.reshape(bb.emit(op.permute_dims(o, [0, 2, 1, 3])), (batch, seq, heads * dim))

    return relax_main(params, body)


def test_symbolic_length_takes_the_vector_paths(rand):
    """At a symbolic key count the row max still runs per vector lane (over whole vectors,
    ``pad_symbolic_max``), q·kᵀ accumulates in a local tile, and after the lowering's first
    passes every per-tile softmax buffer holds one head (``FoldNestedMods``)."""
    from schedules.cpu.index_forms import FoldNestedMods, opaque_blocks

    batch, seq = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    compiled = compile_attention(head_major_gqa(batch, seq, 8, 4, 64))
    [func] = [f for f in compiled.lowered.functions.values() if isinstance(f, tirx.PrimFunc)]
    sch = s_tir.Schedule(func)
    names = {sch.get(b).name_hint: b for b in _all_blocks(sch)}
    lane_max = [sch.get(loop).kind for loop in sch.get_loops(names["T_softmax_maxelem_rf_update"])]
    assert lane_max[-1] == tirx.ForKind.VECTORIZED
    assert any(name.endswith("_local") for name in names)
    lower = tvm.transform.Sequential([*opaque_blocks(), FoldNestedMods(), s_tir.transform.CompactBufferAllocation()])
    with llvm_target():
        lowered = lower(tvm.IRModule({"main": func}))["main"]
    shapes = {}

    def visit(block):
        for buf in block.alloc_buffers:
            shapes[buf.name] = list(buf.shape)

    tvm_ffi.structural_walk(lowered.body, [(s_tir.SBlock, visit)])
    per_tile = [shape for name, shape in shapes.items() if name.startswith("T_softmax")]
    assert per_tile and all(len(shape) > 2 and is_one(shape[0]) and is_one(shape[1]) for shape in per_tile), shapes


def _attention(q, k, v, mask):
    scores = relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2]))
    return relax.op.matmul(relax.op.nn.softmax(relax.op.add(scores, mask), axis=-1), v)


def test_rule_declines_functions_that_are_not_attention():
    """One matmul, a softmax, and two matmuls not joined by a softmax are left to the
    other rules."""
    def two_matmuls(a, b, c):
        return relax.op.matmul(relax.op.matmul(a, b), c)

    cases = [
        ([(2, 16, 8), (2, 8, 16)], relax.op.matmul),
        ([(2, 16, 16)], lambda s: relax.op.nn.softmax(s, axis=-1)),
    ]
    for shapes, body in cases:
        for func in prim_funcs(relax_module(shapes, body)).values():
            assert Attention().apply(func, llvm_target(), False) is None
    from tvm.relax.dpl import is_op, wildcard

    pattern = is_op("relax.matmul")(is_op("relax.matmul")(wildcard(), wildcard()), wildcard())
    [func] = prim_funcs(relax_module([(2, 16, 8), (2, 8, 16), (2, 16, 8)], two_matmuls, pattern)).values()
    assert Attention().apply(func, llvm_target(), False) is None


def test_attention_is_tried_before_the_generic_reduction_rule():
    names = [type(rule).__name__ for rule in default_rules(llvm_target())]
    assert names.index("Attention") < names.index("Reduction")


def test_scheduled_kernel_keeps_each_row_sum_serial(rand):
    """The softmax sum of a row adds its keys in order (no rfactor, no vector lanes over the
    keys: only the tile's rows are interleaved); the max, exact in any order, is taken per
    vector lane when the keys are whole vectors."""
    shapes = [(1, 2, 40, 16), (1, 2, 48, 16), (1, 2, 48, 16), (1, 2, 40, 48)]
    from tvm.relax.dpl import is_op, wildcard

    pattern = is_op("relax.matmul")(is_op("relax.nn.softmax")(is_op("relax.add")(
        is_op("relax.matmul")(wildcard(), is_op("relax.permute_dims")(wildcard())), wildcard())), wildcard())
    [func] = prim_funcs(relax_module(shapes, _attention, pattern)).values()
    sch = Attention().apply(func, llvm_target(), False)
    assert sch is not None
    names = {sch.get(b).name_hint: b for b in _all_blocks(sch)}
    assert "T_softmax_maxelem_rf_update" in names and not any("expsum_rf" in n for n in names)
    kinds = [sch.get(loop).kind for loop in sch.get_loops(names["T_softmax_expsum"])]
    assert tirx.ForKind.VECTORIZED not in kinds
    lane_max = [sch.get(loop).kind for loop in sch.get_loops(names["T_softmax_maxelem_rf_update"])]
    assert lane_max[-1] == tirx.ForKind.VECTORIZED
    # 40 queries over 48 keys (cross-attention shapes): the numbers too
    q, k, v, m = (rand(*shape) for shape in shapes)
    mod = relax_module(shapes, _attention, pattern)
    with llvm_target():
        mod = apply_default_schedules()(mod)
    assert [str(f.attrs["aicf.schedule"]) for f in prim_funcs(mod).values()] == ["Attention"]
    s = q.astype(np.float64) @ k.transpose(0, 1, 3, 2) + m
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(run(mod, [q, k, v, m]), e / e.sum(-1, keepdims=True) @ v, rtol=2e-5, atol=2e-6)


def test_one_pass_with_a_row_tail_matches_numpy(rand):
    """37 queries over 64 keys (whole key tiles, the last row tile padded): q·kᵀ runs in
    the softmax's tile loop, and the padded rows reach no output."""
    shapes = [(1, 2, 37, 16), (1, 2, 64, 16), (1, 2, 64, 16), (1, 2, 37, 64)]
    mod, func = _scheduled_attention(shapes)
    assert max(map(_matmuls, _parallel_loops(func))) == 2
    _matches_numpy(mod, shapes, rand)


def _scheduled_attention(shapes: list[tuple[int, ...]], target=None) -> tuple[tvm.IRModule, tirx.PrimFunc]:
    """``_attention`` on q, k, v and mask of ``shapes``, fused and scheduled by the rule
    (for ``target``, default: this CPU)."""
    from tvm.relax.dpl import is_op, wildcard

    pattern = is_op("relax.matmul")(is_op("relax.nn.softmax")(is_op("relax.add")(
        is_op("relax.matmul")(wildcard(), is_op("relax.permute_dims")(wildcard())), wildcard())), wildcard())
    mod = relax_module(shapes, _attention, pattern)
    with target or llvm_target():
        mod = apply_default_schedules()(mod)
    [func] = prim_funcs(mod).values()
    assert str(func.attrs["aicf.schedule"]) == "Attention"
    return mod, func


@pytest.mark.parametrize("seq", [41, 128, 203])
def test_avx2_tiles_compute_the_attention(rand, seq):
    """Scheduled for an AVX2 CPU (6-row tiles 2 vectors wide, p·v 6 rows by 2 head
    vectors; 41, 128 and 203 rows end in a partial tile), the kernel matches numpy in
    float64; AVX2 code runs on every x86 CPU of this suite.  q is scaled as a model scales
    it (1/8), so float32's rounding of the scores stays far below the tolerance."""
    avx2 = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell", "num-cores": 2})
    assert plan_attention(seq, seq, 64, float32_lanes(avx2), vector_registers(avx2)).rows == 6
    shapes = [(1, 2, seq, 64), (1, 2, seq, 64), (1, 2, seq, 64), (1, 2, seq, seq)]
    mod, _ = _scheduled_attention(shapes, avx2)
    q, k, v, m = (rand(*shape) for shape in shapes)
    q = (q / 8).astype(np.float32)
    s = q.astype(np.float64) @ k.transpose(0, 1, 3, 2) + m
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(run(mod, [q, k, v, m]), e / e.sum(-1, keepdims=True) @ v, rtol=2e-5, atol=2e-6)


def _matches_numpy(mod: tvm.IRModule, shapes: list[tuple[int, ...]], rand) -> None:
    q, k, v, m = (rand(*shape) for shape in shapes)
    s = q.astype(np.float64) @ k.transpose(0, 1, 3, 2) + m
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(run(mod, [q, k, v, m]), e / e.sum(-1, keepdims=True) @ v, rtol=2e-5, atol=2e-6)


def _heads_and_rows_by_step(func: tirx.PrimFunc, block_name: str) -> list[tuple[int, int]]:
    """Per step of the parallel loop around ``block_name``, the head and first query row
    its block binds (every other loop at 0)."""
    found = []

    def visit(loop: tirx.For) -> None:
        if loop.kind != tirx.ForKind.PARALLEL:
            return

        def realize(node: s_tir.SBlockRealize) -> None:
            if node.block.name_hint == block_name:
                found.append((loop, node.iter_values))

        tvm_ffi.structural_walk(loop.body, [(s_tir.SBlockRealize, realize)])

    tvm_ffi.structural_walk(func.body, [(tirx.For, visit)])
    [(loop, values)] = found
    analyzer = tvm.sym.analyzer.Analyzer()

    def at(expr: tirx.Expr, step: int) -> int:
        value = tvm_ffi.structural_map(expr, [(tirx.Var, lambda v: tirx.const(
            step if v.same_as(loop.loop_var) else 0, str(v.ty)))])
        return int(analyzer.simplify(value))

    return [(at(values[1], step), at(values[2], step)) for step in range(int(loop.extent))]


def test_a_heads_row_tiles_run_in_turn_on_a_core(rand):
    """At a constant length the parallel tile loop runs one head's row tiles in order,
    then the next head's: a core's chunk of it reads one head's kᵀ and v at a time (they
    stay in L2).  41 queries over 41 keys, three heads; the output matches numpy."""
    shapes = [(1, 3, 41, 16), (1, 3, 41, 16), (1, 3, 41, 16), (1, 3, 41, 41)]
    mod, func = _scheduled_attention(shapes)
    rows = plan_attention(41, 41, 16, float32_lanes(llvm_target()), vector_registers(llvm_target())).rows
    tiles = -(-41 // rows)
    steps = _heads_and_rows_by_step(func, "matmul1_update")
    assert steps == [(step // tiles, step % tiles * rows) for step in range(3 * tiles)], steps
    _matches_numpy(mod, shapes, rand)


def _all_blocks(sch: s_tir.Schedule) -> list:
    out = []

    def visit(block):
        for child in sch.get_child_blocks(block):
            out.append(child)
            visit(child)

    visit(sch.get_sblock("root"))
    return out


@pytest.mark.parametrize("dim", [8, 32, 64, 80, 128])
def test_plan_keeps_accumulators_within_the_registers(dim):
    for m, n in ((1, 1), (7, 7), (197, 197), (None, None)):
        plan = plan_attention(m, n, dim, lanes=16)
        assert plan.rows == (min(8, m) if m else 8)
        assert plan.rows * plan.key_vectors <= 16
        assert dim % plan.head_lanes == 0 and (dim // plan.head_lanes) % plan.head_splits == 0
        assert plan.rows * (dim // plan.head_lanes // plan.head_splits) <= 16


@pytest.mark.parametrize("dim", [32, 64, 80, 96, 128])
def test_an_avx2_plan_fills_the_registers_with_12_accumulators(dim):
    """16 registers (AVX2): a tile 2 vectors wide has 6 rows (12 accumulators beside 2 loaded
    vectors and a broadcast; p·v's parts 2 head vectors wide), or 4 rows within half the
    registers as the rule was (``full_tile=False``); keys too few for 2 vectors keep up to
    8 rows.  Every part of p·v's tile fits beside its loaded vectors and broadcast."""
    for full, rows, accumulators in ((True, 6, 12), (False, 4, 8)):
        for m, n in ((197, 197), (1500, 1500), (None, None), (128, 128)):
            plan = plan_attention(m, n, dim, lanes=8, registers=16, full_tile=full)
            assert (plan.rows, plan.key_vectors) == (rows, 2)
            part = plan.part_vectors(dim)
            assert plan.rows * part <= accumulators and plan.rows * part + part + 1 <= 16
            assert plan.head_splits * part * plan.head_lanes == dim
        short = plan_attention(49, 49, dim, lanes=8, registers=16, full_tile=full)  # Swin's windows: 56 keys
        assert (short.rows, short.key_vectors) == (7, 1)
        assert plan_attention(1, 40, dim, lanes=8, registers=16, full_tile=full).rows == 1


def test_plan_takes_fewer_rows_only_when_they_save_padding():
    assert plan_attention(49, 49, 32, lanes=16).rows == 7  # Swin's 7x7 windows: no padded row
    assert plan_attention(14, 14, 32, lanes=16).rows == 7
    assert plan_attention(197, 197, 64, lanes=16).rows == 8  # 200 rows beat 6-row tiles' 198
    assert plan_attention(128, 128, 64, lanes=16).rows == 8


def test_a_view_shared_with_the_rotary_path_stays_outside_the_attention(rand):
    """ModernBERT's form: the packed q/k/v is reshaped once, v reaches attention through
    views of that reshape, and q and k through an elementwise op on it (the rotary
    embedding).  The match that takes v's whole view chain is not convex; without the
    shared reshape it is (``FuseEmits``), so attention is one kernel, reading v through
    the shared view, and the output matches numpy."""
    seq, heads, dim = 37, 2, 32
    packed = relax.Var("qkv", relax.TensorType((1, seq, 3 * heads * dim), F32))
    op = relax.op

    def body(bb, qkv):
        shared = bb.emit(op.reshape(qkv, (1, seq, 3, heads, dim)))

        def part(index):
            x = bb.emit(op.strided_slice(shared, axes=[2], begin=[index], end=[index + 1]))
            return bb.emit(op.permute_dims(bb.emit(op.squeeze(x, [2])), [0, 2, 1, 3]))

        q = bb.emit(op.multiply(part(0), relax.const(0.5, F32)))  # stands in for the rotary
        k = bb.emit(op.add(part(1), relax.const(0.25, F32)))
        s = bb.emit(op.multiply(bb.emit(op.matmul(q, bb.emit(op.permute_dims(k, [0, 1, 3, 2])))),
                                relax.const(float(1 / np.sqrt(dim)), F32)))
        o = bb.emit(op.matmul(bb.emit(op.nn.softmax(s, axis=-1)), part(2)))
        return op.reshape(bb.emit(op.permute_dims(o, [0, 2, 1, 3])), (1, seq, heads * dim))

    compiled = aicf_tvm.compile(relax_main([packed], body), target=llvm_target())
    assert [k.kind for k in compiled.kernels].count("fused_attention") == 1
    x = rand(1, seq, 3 * heads * dim)
    parts = x.astype(np.float64).reshape(1, seq, 3, heads, dim).transpose(2, 0, 3, 1, 4)
    q, k, v = parts[0] * 0.5, parts[1] + 0.25, parts[2]
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dim)
    e = np.exp(s - s.max(-1, keepdims=True))
    want = (e / e.sum(-1, keepdims=True) @ v).transpose(0, 2, 1, 3).reshape(1, seq, heads * dim)
    np.testing.assert_allclose(numpy_of(compiled(x)), want, rtol=2e-5, atol=2e-6)


def _buffer_shapes(func: tirx.PrimFunc) -> list[tuple[int, ...]]:
    shapes = []
    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, lambda b: shapes.extend(
        tuple(int(x) for x in buf.shape) for buf in b.alloc_buffers))])
    return shapes


def test_v_is_packed_in_slices_of_the_pv_tile_with_the_same_bits(rand):
    """Several row tiles per head: v, read in place from rows of all heads, is copied once
    into slices of p·v's register tile width, each slice's keys contiguous
    ``[batch, heads, dim / width, keys, width]``; the output has the bits of the build that reads
    v in place, and matches numpy."""
    seq, heads, dim = 203, 2, 64
    target = llvm_target()
    plan = plan_attention(seq, seq, dim, float32_lanes(target), vector_registers(target))
    width = dim // plan.head_splits
    args = operands(rand, seq, heads, dim, heads)
    outputs = {}
    for flag in (True, False):
        compiled = compile_attention(sdpa(seq, heads, dim, mask=False), target,
                                     aicf_tvm.CompileOptions(attention_pack_v=flag))
        [func] = [f for f in compiled.lowered.functions.values() if isinstance(f, tirx.PrimFunc)]
        assert ((1, heads, dim // width, seq, width) in _buffer_shapes(func)) == flag
        outputs[flag] = numpy_of(compiled(*args))
    np.testing.assert_array_equal(outputs[True], outputs[False])
    np.testing.assert_allclose(outputs[True], reference(*args, None, heads, dim), rtol=2e-5, atol=2e-6)
