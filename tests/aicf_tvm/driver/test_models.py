"""The built-in models build on llvm and compute what an independent numpy version does
(on two different inputs, whose reference outputs are checked to differ first)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import tvm
from tvm import relax

from aicf_tvm.driver.models import (
    BUILTIN_MODELS,
    SMALL_SIZES,
    causal_mask,
    decoder_block,
    encoder_layer,
    resolve_model,
)

from ...helpers import assert_matches_reference, ort_function

TARGET = tvm.target.Target({"kind": "llvm"})
ENC = SMALL_SIZES["encoder_layer"]
DEC = SMALL_SIZES["decoder_block"]
_erf = np.vectorize(math.erf)


def vm_function(mod: tvm.IRModule) -> Callable[..., np.ndarray]:
    """``mod`` built once by TVM's default pipeline, as ``f(*inputs) -> output``."""
    ex = tvm.compile(mod, TARGET, relax_pipeline=relax.get_default_pipeline(TARGET))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return lambda *inputs: vm["main"](*(tvm.runtime.tensor(a) for a in inputs)).numpy()


def activation(seq: int, hidden: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, seq, hidden)).astype(np.float32)


def activations(seq: int, hidden: int) -> list[np.ndarray]:
    """Two different inputs (the weights come from seed 0)."""
    return [activation(seq, hidden, seed) for seed in (1, 2)]


# Independent float64 reference: written from the textbook formulas, not from the IR.
def _linear(x, w, prefix):
    y = x @ w[f"{prefix}.weight"].astype(np.float64).T
    bias = w.get(f"{prefix}.bias")
    return y if bias is None else y + bias


def _attention(x, w, heads, mask):
    batch, seq, hidden = x.shape
    d = hidden // heads

    def split(t):
        return t.reshape(batch, seq, heads, d).transpose(0, 2, 1, 3)

    q, k, v = (split(_linear(x, w, f"attn.{p}_proj")) for p in "qkv")
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
    if mask is not None:
        scores = scores + mask
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
    return _linear(context, w, "attn.o_proj")


def _layer_norm(x, w, prefix, eps=1e-12):
    centered = x - x.mean(-1, keepdims=True)
    normed = centered / np.sqrt((centered**2).mean(-1, keepdims=True) + eps)
    return normed * w[f"{prefix}.weight"] + w[f"{prefix}.bias"]


def _rms_norm(x, w, prefix, eps=1e-5):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * w[f"{prefix}.weight"]


def numpy_encoder(x, w, heads, mask=None):
    x = x.astype(np.float64)
    h = _layer_norm(x + _attention(x, w, heads, mask), w, "attn_norm")
    f = _linear(h, w, "fc1")
    f = 0.5 * f * (1.0 + _erf(f / math.sqrt(2.0)))
    return _layer_norm(h + _linear(f, w, "fc2"), w, "ffn_norm")


def numpy_decoder(x, w, heads):
    x = x.astype(np.float64)
    seq = x.shape[1]
    mask = np.where(np.triu(np.ones((seq, seq), dtype=bool), k=1), -np.inf, 0.0)
    h = x + _attention(_rms_norm(x, w, "attn_norm"), w, heads, mask)
    n = _rms_norm(h, w, "ffn_norm")
    gate = _linear(n, w, "gate_proj")
    return h + _linear(gate / (1.0 + np.exp(-gate)) * _linear(n, w, "up_proj"), w, "down_proj")


def test_encoder_layer_matches_numpy():
    mod, weights = encoder_layer(**ENC, return_params=True)
    assert_matches_reference(vm_function(mod), lambda x: numpy_encoder(x, weights, ENC["heads"]),
                             [[x] for x in activations(ENC["seq"], ENC["hidden"])], rtol=1e-4, atol=1e-5)


def test_encoder_layer_adds_optional_mask_to_scores():
    mod, weights = encoder_layer(**ENC, attention_mask=True, return_params=True)
    seq = ENC["seq"]
    # Mask out the last quarter of the keys, as a padding mask would.
    mask = np.zeros((1, 1, seq, seq), dtype=np.float32)
    mask[..., 3 * seq // 4 :] = -1e4
    assert [p.name for p in mod["main"].params] == ["x", "mask"]
    assert_matches_reference(vm_function(mod), lambda x, m: numpy_encoder(x, weights, ENC["heads"], m),
                             [[x, mask] for x in activations(seq, ENC["hidden"])], rtol=1e-4, atol=1e-5)


def test_decoder_block_matches_numpy():
    mod, weights = decoder_block(**DEC, return_params=True)
    assert_matches_reference(vm_function(mod), lambda x: numpy_decoder(x, weights, DEC["heads"]),
                             [[x] for x in activations(DEC["seq"], DEC["hidden"])], rtol=1e-4, atol=1e-5)


def test_decoder_block_is_causal():
    """Changing the last token must leave every earlier position's output unchanged."""
    run = vm_function(decoder_block(**DEC))
    x = activation(DEC["seq"], DEC["hidden"])
    x_changed = x.copy()
    x_changed[:, -1] += 1.0
    before, after = run(x), run(x_changed)
    np.testing.assert_array_equal(before[:, :-1], after[:, :-1])
    assert not np.allclose(before[:, -1], after[:, -1])


def test_causal_mask_blocks_only_future_keys():
    mask = causal_mask(3)[0, 0]
    assert mask.shape == (3, 3) and mask.dtype == np.float32
    assert (mask[np.tril_indices(3)] == 0).all()
    assert (mask[np.triu_indices(3, k=1)] < -1e30).all()


@pytest.mark.parametrize("name", sorted(BUILTIN_MODELS))
def test_builtin_model_is_a_pure_single_input_main(name):
    mod = BUILTIN_MODELS[name]()
    _, sizes = resolve_model(name)
    main = mod["main"]
    relax.analysis.well_formed(mod)
    assert [gv.name_hint for gv in mod.get_global_vars()] == ["main"]
    assert main.is_pure and len(main.body.blocks) == 1
    assert isinstance(main.body.blocks[0], relax.DataflowBlock)
    (x,) = main.params
    default_hidden = 768 if name.startswith("encoder") else 512
    expected = (1, sizes.get("seq", 128), sizes.get("hidden", default_hidden))
    assert tuple(int(d) for d in x.ty.shape) == expected and x.ty.dtype == "float32"
    assert not relax.analysis.free_vars(main), "weights must be bound as constants"


def test_same_seed_gives_same_weights_and_other_seed_differs():
    _, a = decoder_block(**DEC, return_params=True)
    _, b = decoder_block(**DEC, return_params=True)
    _, c = decoder_block(**DEC, seed=1, return_params=True)
    assert a.keys() == b.keys() == c.keys()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["gate_proj.weight"], c["gate_proj.weight"])
    # Norm scales are centred on 1, projections on 0.
    assert abs(a["ffn_norm.weight"].mean() - 1) < 0.05 and abs(a["up_proj.weight"].mean()) < 0.01


def test_rejects_hidden_not_divisible_by_heads():
    with pytest.raises(ValueError, match="hidden=65 is not divisible by heads=4"):
        encoder_layer(seq=4, hidden=65, heads=4, ffn=8)


def test_unknown_model_name_lists_known_ones():
    with pytest.raises(KeyError, match="unknown built-in model 'gpt'.*decoder_block"):
        resolve_model("gpt")


@pytest.mark.parametrize("name", ["encoder_layer_small", "decoder_block_small"])
def test_onnx_twin_matches_tvm_build(name):
    pytest.importorskip("onnxruntime")
    from aicf_tvm.driver.models_onnx import to_onnx

    sizes = resolve_model(name)[1]
    assert_matches_reference(ort_function(to_onnx(name)), vm_function(BUILTIN_MODELS[name]()),
                             [[x] for x in activations(sizes["seq"], sizes["hidden"])], rtol=1e-4, atol=1e-5)


def test_onnx_twin_of_masked_encoder_takes_the_mask():
    pytest.importorskip("onnxruntime")
    from aicf_tvm.driver.models_onnx import to_onnx

    seq = ENC["seq"]
    mask = np.zeros((1, 1, seq, seq), dtype=np.float32)
    mask[..., -2:] = -1e4
    assert_matches_reference(ort_function(to_onnx("encoder_layer_small", attention_mask=True)),
                             vm_function(encoder_layer(**ENC, attention_mask=True)),
                             [[x, mask] for x in activations(seq, ENC["hidden"])], rtol=1e-4, atol=1e-5)
