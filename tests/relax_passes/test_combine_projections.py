"""CombineProjections: one GEMM for the head-split projections of one input, slices for
a split; only where every consumer is a view, and with the same values."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import aicf_tvm
from relax_passes.combine_projections import CombineProjections

from ..conftest import run_vm
from ..helpers import (
    Operands,
    assert_matches_reference,
    last_hidden_state,
    relax_main,
    torch_function,
)

ROWS, HIDDEN, HEADS = 12, 32, 4


def _ops(mod: tvm.IRModule, name: str) -> int:
    return mod.script(show_meta=False).count(f"R.{name}(")


def _projections(rand: Operands, widths: tuple[int, ...], bias: bool | tuple[bool, ...] = True,
                 head_split: bool = True, rows=ROWS):
    """``main(x)``: x projected by one weight per width (with a bias, per branch when
    ``bias`` is a tuple), each result split into heads (reshape + permute_dims) or, with
    ``head_split=False``, through silu; ``rows`` may be a symbolic var."""
    weights = [rand(HIDDEN, w) for w in widths]
    biases = [rand(w) for w in widths]
    with_bias = bias if isinstance(bias, tuple) else (bias,) * len(widths)

    def body(bb, x):
        outs = []
        for w, b, has_bias in zip(weights, biases, with_bias):
            # once per Linear, as frontends do
            flat = bb.emit(relax.op.reshape(x, relax.ShapeExpr([rows, HIDDEN])))
            y = bb.emit(relax.op.matmul(flat, relax.const(w)))
            if has_bias:
                y = bb.emit(relax.op.add(relax.const(b), y))
            if head_split:
                y = bb.emit(relax.op.reshape(y, relax.ShapeExpr([1, rows, HEADS, w.shape[1] // HEADS])))
                outs.append(bb.emit(relax.op.permute_dims(y, [0, 2, 1, 3])))
            else:
                outs.append(bb.emit(relax.op.nn.silu(y)))
        return relax.Tuple(outs)

    return relax_main([relax.Var("x", relax.TensorType([1, rows, HIDDEN], "float32"))], body)


@pytest.mark.parametrize("bias", [True, False])
def test_head_split_projections_become_one_gemm_with_the_same_values(bias):
    rand = Operands(3)
    mod = _projections(rand, (32, 16, 16), bias=bias)  # grouped-query widths: q wider than k, v
    got = CombineProjections()(mod)
    assert _ops(mod, "matmul") == 3 and _ops(got, "matmul") == 1
    assert _ops(got, "strided_slice") == 3 and _ops(got, "add") == (1 if bias else 0)
    x, other = rand(1, ROWS, HIDDEN), rand(1, ROWS, HIDDEN)
    assert_matches_reference(lambda a: np.concatenate([o.ravel() for o in run_vm(got, a)]),
                             lambda a: np.concatenate([o.ravel() for o in run_vm(mod, a)]),
                             [[x], [other]], rtol=0, atol=0)


def test_projections_of_a_symbolic_number_of_rows_combine_with_the_same_values():
    """A prompt of any length (``compile_causal_lm``'s prompt function): the rows are
    symbolic, each column still its own dot product; prompts of 5 and 12 rows keep their
    bits, and the one-row decode function then combines the same weights (one copy)."""
    rand = Operands(5)
    mod = _projections(rand, (32, 16, 16), rows=tvm.tirx.Var("n", "int64"))
    got = CombineProjections()(mod)
    assert _ops(mod, "matmul") == 3 and _ops(got, "matmul") == 1 and _ops(got, "strided_slice") == 3
    for rows in (5, 12):
        x = rand(1, rows, HIDDEN)
        for a, b in zip(run_vm(mod, x), run_vm(got, x)):
            np.testing.assert_array_equal(a, b)


def test_a_projection_without_bias_joins_with_an_exact_minus_zero():
    """BEiT's k has no bias: it joins q and v with -0.0 added, and every output keeps its
    bits (x + (-0.0) is x for every float; +0.0 would turn a -0.0 into +0.0)."""
    rand = Operands(7)
    mod = _projections(rand, (32, 32, 32), bias=(True, False, True))
    got = CombineProjections()(mod)
    assert _ops(got, "matmul") == 1 and _ops(got, "add") == 1
    bias = [c for c in _constants(got) if c.ndim == 1]
    assert len(bias) == 1 and np.signbit(bias[0][32:64]).all() and (bias[0][32:64] == 0).all()
    x = rand(1, ROWS, HIDDEN)
    for a, b in zip(run_vm(mod, x), run_vm(got, x)):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def _constants(mod: tvm.IRModule) -> list[np.ndarray]:
    found: list[np.ndarray] = []

    def visit(expr) -> None:
        if isinstance(expr, tvm.ir.Constant) and hasattr(expr.value, "numpy"):  # not a shape's ints
            found.append(expr.value.numpy())

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return found


def test_gemms_whose_consumer_computes_keep_their_own_epilogue():
    mod = _projections(Operands(4), (32, 32), head_split=False)  # a gated MLP's gate and up
    tvm.ir.assert_structural_equal(CombineProjections()(mod), mod)


def test_projections_of_different_inputs_or_k_stay_apart():
    rand = Operands(5)
    w1, w2, w3 = rand(HIDDEN, 16), rand(HIDDEN, 16), rand(16, 16)

    def body(bb, x, z):
        heads = []
        for lhs, w in ((x, w1), (z, w2), (bb.emit(relax.op.strided_slice(x, [1], [0], [16])), w3)):
            y = bb.emit(relax.op.matmul(lhs, relax.const(w)))
            y = bb.emit(relax.op.reshape(y, relax.ShapeExpr([ROWS, 2, 8])))
            heads.append(bb.emit(relax.op.permute_dims(y, [1, 0, 2])))
        return relax.Tuple(heads)

    ty = relax.TensorType([ROWS, HIDDEN], "float32")
    mod = relax_main([relax.Var("x", ty), relax.Var("z", ty)], body)
    assert _ops(CombineProjections()(mod), "matmul") == 3


def test_a_split_read_by_items_becomes_slices():
    def body(bb, x):
        parts = bb.emit(relax.op.split(x, [8, 24], axis=-1))
        items = [bb.emit(relax.TupleGetItem(parts, i)) for i in range(3)]
        return relax.Tuple([bb.emit(relax.op.permute_dims(item)) for item in items])

    mod = relax_main([relax.Var("x", relax.TensorType([ROWS, HIDDEN], "float32"))], body)
    got = CombineProjections()(mod)
    assert _ops(got, "split") == 0 and _ops(got, "strided_slice") == 3
    x = Operands(6)(ROWS, HIDDEN)
    for want, out in zip(run_vm(mod, x), run_vm(got, x)):
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama"])
def test_transformer_layers_lose_their_projection_kernels_and_keep_their_bits(arch):
    """Through the user's path: fewer kernels (BERT and LLaMA's q/k/v in one GEMM, GPT-2's
    split read by attention), outputs equal PyTorch's and bit-equal the build without."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    if arch == "bert":
        model = tf.BertModel(tf.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=128, vocab_size=100))
    elif arch == "gpt2":
        model = tf.GPT2Model(tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100))
    else:
        model = tf.LlamaModel(tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, vocab_size=100))
    module = last_hidden_state(model.eval())
    gen = torch.Generator().manual_seed(1)
    sets = [(torch.randint(0, 100, (1, 16), generator=gen), torch.ones((1, 16), dtype=torch.int64))
            for _ in range(2)]
    mod = aicf_tvm.from_torch(module, sets[0])
    combined = aicf_tvm.compile(mod, target="llvm")
    separate = aicf_tvm.compile(mod, target="llvm", options=aicf_tvm.CompileOptions(combine_projections=False))
    assert len(combined.kernels) < len(separate.kernels)
    names = [k.name for k in combined.kernels]
    assert not any("split" in name for name in names), names
    numpy_sets = [[t.numpy() for t in s] for s in sets]
    assert_matches_reference(combined, torch_function(module), numpy_sets, rtol=1e-4, atol=1e-5)
    for args in numpy_sets:
        np.testing.assert_array_equal(combined(*args), separate(*args))

