"""fused_attention on attention as torch.export decomposes SDPA: one kernel per layer.

The modules below spell out what ``torch.export`` gives for HF BERT/GPT-2/LLaMA: the head
split (reshape + permute_dims) after the projections, √scale on q and on kᵀ, the 3-D
reshapes around a batched matmul, the broadcast mask add, softmax and SDPA's
all-masked-row guard, then the head merge. References are numpy (written from the math,
a fully masked row gives 0) and TVM's default build of the same module.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import aicf_tvm

from ...conftest import run_vm
from ...helpers import last_hidden_state

TARGET = {"kind": "llvm", "num-cores": 2}
S, H, D = 8, 4, 8
SCALE = float(np.float32(1 / np.sqrt(np.sqrt(D))))


@I.ir_module
class Sdpa:
    @R.function
    def main(q: R.Tensor((1, 8, 32), "float32"), k: R.Tensor((1, 8, 32), "float32"),
             v: R.Tensor((1, 8, 32), "float32"), mask: R.Tensor((1, 1, 8, 8), "float32")):
        with R.dataflow():
            q4 = R.permute_dims(R.reshape(q, R.shape([1, 8, 4, 8])), axes=[0, 2, 1, 3])
            k4 = R.permute_dims(R.reshape(k, R.shape([1, 8, 4, 8])), axes=[0, 2, 1, 3])
            v4 = R.permute_dims(R.reshape(v, R.shape([1, 8, 4, 8])), axes=[0, 2, 1, 3])
            qs = R.multiply(q4, R.const(SCALE, "float32"))
            kt = R.multiply(R.permute_dims(k4, axes=[0, 1, 3, 2]), R.const(SCALE, "float32"))
            s3 = R.matmul(R.reshape(R.broadcast_to(qs, R.shape([1, 4, 8, 8])), R.shape([4, 8, 8])),
                          R.reshape(R.broadcast_to(kt, R.shape([1, 4, 8, 8])), R.shape([4, 8, 8])))
            s = R.add(R.reshape(s3, R.shape([1, 4, 8, 8])), mask)
            p = R.nn.softmax(s, axis=-1)
            any_kept = R.max(R.astype(R.logical_not(R.equal(s, R.const(float("-inf"), "float32"))), "int8"),
                             axis=[-1], keepdims=True)
            p0 = R.where(R.logical_not(R.astype(any_kept, "bool")), R.const(0.0, "float32"), p)
            o3 = R.matmul(R.reshape(p0, R.shape([4, 8, 8])), R.reshape(v4, R.shape([4, 8, 8])))
            o = R.permute_dims(R.reshape(o3, R.shape([1, 4, 8, 8])), axes=[0, 2, 1, 3])
            out = R.reshape(o, R.shape([1, 8, 32]))
            R.output(out)
        return out


@I.ir_module
class GroupedQuerySdpa:
    """LLaMA's repeat_kv: 2 k/v heads serve 4 query heads (expand_dims, broadcast_to, reshape)."""

    @R.function
    def main(q: R.Tensor((1, 8, 32), "float32"), k: R.Tensor((1, 8, 16), "float32"),
             v: R.Tensor((1, 8, 16), "float32"), mask: R.Tensor((1, 1, 8, 8), "float32")):
        with R.dataflow():
            q4 = R.permute_dims(R.reshape(q, R.shape([1, 8, 4, 8])), axes=[0, 2, 1, 3])
            k2 = R.permute_dims(R.reshape(k, R.shape([1, 8, 2, 8])), axes=[0, 2, 1, 3])
            v2 = R.permute_dims(R.reshape(v, R.shape([1, 8, 2, 8])), axes=[0, 2, 1, 3])
            k4 = R.reshape(R.broadcast_to(R.expand_dims(k2, axis=[2]), R.shape([1, 2, 2, 8, 8])),
                           R.shape([1, 4, 8, 8]))
            v4 = R.reshape(R.broadcast_to(R.expand_dims(v2, axis=[2]), R.shape([1, 2, 2, 8, 8])),
                           R.shape([1, 4, 8, 8]))
            qs = R.multiply(q4, R.const(SCALE, "float32"))
            kt = R.multiply(R.permute_dims(k4, axes=[0, 1, 3, 2]), R.const(SCALE, "float32"))
            s3 = R.matmul(R.reshape(qs, R.shape([4, 8, 8])), R.reshape(kt, R.shape([4, 8, 8])))
            s = R.add(R.reshape(s3, R.shape([1, 4, 8, 8])), mask)
            p = R.nn.softmax(s, axis=-1)
            any_kept = R.max(R.astype(R.logical_not(R.equal(s, R.const(float("-inf"), "float32"))), "int8"),
                             axis=[-1], keepdims=True)
            p0 = R.where(R.logical_not(R.astype(any_kept, "bool")), R.const(0.0, "float32"), p)
            o3 = R.matmul(R.reshape(p0, R.shape([4, 8, 8])), R.reshape(v4, R.shape([4, 8, 8])))
            o = R.permute_dims(R.reshape(o3, R.shape([1, 4, 8, 8])), axes=[0, 2, 1, 3])
            out = R.reshape(o, R.shape([1, 8, 32]))
            R.output(out)
        return out


def heads(x: np.ndarray, n: int) -> np.ndarray:
    return x.reshape(S, n, -1).transpose(1, 0, 2)


def reference(q, k, v, mask, kv_heads=H):
    """SDPA with SDPA's guard, in numpy: a row whose scores are all -inf gives 0."""
    rep = H // kv_heads
    qh = heads(q[0], H) * np.float32(SCALE)
    kh = np.repeat(heads(k[0], kv_heads), rep, axis=0)
    vh = np.repeat(heads(v[0], kv_heads), rep, axis=0)
    s = (qh @ (kh.transpose(0, 2, 1) * np.float32(SCALE))) + mask[0]
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
    p = np.where(np.isneginf(s).all(-1, keepdims=True), np.float32(0), p)
    return (p @ vh).transpose(1, 0, 2).reshape(1, S, H * D)


def inputs(kv_width: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, S, H * D)).astype("float32")
    k = rng.standard_normal((1, S, kv_width)).astype("float32")
    v = rng.standard_normal((1, S, kv_width)).astype("float32")
    causal = np.where(np.tril(np.ones((S, S), bool)), 0, -np.inf).astype("float32")
    causal[:, -2:] = -np.inf  # padding: the last two keys
    causal[5, :] = -np.inf  # query 5 sees nothing: SDPA gives 0, a plain softmax NaN
    return [q, k, v, causal.reshape(1, 1, S, S)]


def block_reads(func: tvm.tirx.PrimFunc) -> dict[str, str]:
    """Per block name of the printed PrimFunc, its ``T.reads`` line."""
    out, block = {}, None
    for line in func.script().splitlines():
        found = re.search(r'T\.sblock\("([^"]+)"\)', line)
        if found:
            block = found.group(1)
        elif block is not None and "T.reads(" in line:
            out[block] = line.strip()
    return out


@pytest.mark.parametrize("mod, kv_width", [(Sdpa, H * D), (GroupedQuerySdpa, 2 * D)], ids=["mha", "gqa"])
class TestDecomposedSdpa:
    def test_is_one_kernel_with_views_read_in_place(self, mod, kv_width):
        """Head split, kᵀ, repeat_kv, mask add, softmax, guard and head merge: one kernel,
        scheduled by the Attention rule (tiled, vectorized matmuls); no transpose or repeat of
        its own."""
        compiled = aicf_tvm.compile(mod, target=TARGET)
        assert [(k.kind, k.schedule) for k in compiled.kernels] == [("fused_attention", "Attention")]
        func = compiled.lowered[compiled.kernels[0].name]
        text = func.script()
        assert "T.parallel" in text and "T.vectorized" in text
        # p·v reads v straight from the parameter, through the views' index arithmetic
        v_param = func.params[2].name
        assert any(f"{v_param}[" in reads for name, reads in block_reads(func).items() if name.startswith("matmul"))

    def test_numbers_match_numpy_and_tvm(self, mod, kv_width):
        args = inputs(kv_width)
        compiled = aicf_tvm.compile(mod, target=TARGET)
        got = compiled(*args)
        got = got.numpy() if hasattr(got, "numpy") else got
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, reference(*args, kv_heads=kv_width // D), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got, run_vm(mod, *args)[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got[0, 5], 0)  # the fully masked query row


@relax.expr_functor.mutator
class _GuardOverHeads(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.max":
            return relax.op.max(call.args[0], axis=[1], keepdims=True)
        return call


def GuardOverHeads(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with the guard's max over the heads axis instead of the scores' last axis."""
    out = mod.clone()
    out["main"] = _GuardOverHeads().visit_expr(mod["main"])
    return out


def test_guard_over_another_axis_is_not_taken_as_the_row_guard():
    """A max over the heads axis is not SDPA's row guard: the fused Emit leaves it out."""
    mod = GuardOverHeads(Sdpa)
    compiled = aicf_tvm.compile(mod, target=TARGET)
    attention = [k for k in compiled.kernels if k.kind == "fused_attention"]
    assert attention == [] and len(compiled.kernels) > 1
    args = inputs(H * D)
    args[3][0, 0, 5, :] = 0.0  # no fully masked row: both guards agree, NaN-free
    got = compiled(*args)
    got = got.numpy() if hasattr(got, "numpy") else got
    np.testing.assert_allclose(got, run_vm(mod, *args)[0], rtol=1e-5, atol=1e-6)


def _hf_models():
    transformers = pytest.importorskip("transformers")
    return {
        "bert": lambda: transformers.BertModel(transformers.BertConfig(
            num_hidden_layers=1, hidden_size=128, num_attention_heads=4, intermediate_size=256)),
        "gpt2": lambda: transformers.GPT2Model(transformers.GPT2Config(n_layer=1, n_embd=128, n_head=4)),
        "llama_gqa": lambda: transformers.LlamaModel(transformers.LlamaConfig(
            hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=8,
            num_key_value_heads=2, vocab_size=1000)),
    }


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama_gqa"])
def test_transformers_attention_is_one_kernel_and_matches_torch(name):
    """A real HF layer through torch.export: one attention kernel, no head split/merge
    kernels (LLaMA's rotary embedding still reads q/k split into heads), and the outputs
    of PyTorch for a full, a padding and an all-zero attention mask."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = _hf_models()[name]().eval()

    wrapped = last_hidden_state(model, use_cache=False).eval()
    seq = 16
    ids = torch.randint(0, 1000, (1, seq))
    masks = [torch.ones(1, seq, dtype=torch.int64), torch.tensor([[1] * 11 + [0] * 5]),
             torch.zeros(1, seq, dtype=torch.int64)]
    with torch.no_grad():
        compiled = aicf_tvm.compile(aicf_tvm.from_torch(wrapped, (ids, masks[0])), target=TARGET)
        kinds = [k.kind for k in compiled.kernels]
        assert kinds.count("fused_attention") == 1
        if name != "llama_gqa":
            assert "permute_dims" not in kinds
        for mask in masks:
            want = wrapped(ids, mask).numpy()
            got = compiled(ids.numpy(), mask.numpy())
            got = got.numpy() if hasattr(got, "numpy") else got
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
