"""Tiny ``transformers`` architectures whose attention or layout no other test exercises,
through ``aicf_tvm.from_torch`` and ``aicf_tvm.compile``, against PyTorch eager.

Each brings an op pattern of its own: Gemma2's soft-capped scores (``tanh(s / c) * c``) and
sliding-window mask, ModernBERT's alternating local and global attention, BLOOM's ALiBi
bias, LeViT's learned attention biases gathered by index and its subsampling attention,
SegFormer's attention over spatially reduced keys, MobileViT's unfold of feature maps into
patches and back, wav2vec2's conv1d feature encoder (strides 5, 2, 2) and grouped positional
conv1d on raw samples (``relax_passes.Conv1dAsConv2d``).  Weights are random; every model is
first checked to give different
outputs for different inputs, so a kernel that ignored its input could not pass.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import aicf_tvm

SEQ, VOCAB, IMAGE = 8, 100, 32
DECODER = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
               max_position_embeddings=64, num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _gemma2() -> Any:
    return transformers.Gemma2Model(transformers.Gemma2Config(
        **DECODER, head_dim=16, sliding_window=4, attn_logit_softcapping=50.0, final_logit_softcapping=30.0))


def _modernbert() -> Any:
    return transformers.ModernBertModel(transformers.ModernBertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=64, local_attention=4, global_attn_every_n_layers=2,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2))


def _bloom() -> Any:
    return transformers.BloomModel(transformers.BloomConfig(
        vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4, pad_token_id=0, bos_token_id=1, eos_token_id=2))


def _levit() -> Any:
    return transformers.LevitModel(transformers.LevitConfig(
        image_size=IMAGE, patch_size=16, hidden_sizes=[32, 48, 64], num_attention_heads=[1, 2, 2],
        depths=[1, 1, 1], key_dim=[8, 8, 8]))


def _segformer() -> Any:
    return transformers.SegformerModel(transformers.SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3],
        strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2]))


def _mobilevit() -> Any:
    return transformers.MobileViTModel(transformers.MobileViTConfig(
        image_size=IMAGE, hidden_sizes=[32, 40, 48], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64]),
        expand_output=False)


def _wav2vec2() -> Any:
    return transformers.Wav2Vec2Model(transformers.Wav2Vec2Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4))


TEXT: dict[str, Callable[[], Any]] = {"gemma2": _gemma2, "modernbert": _modernbert, "bloom": _bloom}
IMAGES: dict[str, Callable[[], Any]] = {"levit": _levit, "segformer": _segformer, "mobilevit": _mobilevit}
WAVEFORMS: dict[str, Callable[[], Any]] = {"wav2vec2": _wav2vec2}
SAMPLES = 400


class _LastHidden(torch.nn.Module):
    def __init__(self, model: Any, names: list[str]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *args: Any) -> Any:
        extra = {"use_cache": False} if "use_cache" in inspect.signature(self.model.forward).parameters else {}
        return self.model(**dict(zip(self.names, args)), **extra).last_hidden_state


def _inputs(name: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    if name in TEXT:
        mask = np.array([[1] * (SEQ - 2) + [0, 0]], dtype=np.int64)  # the last two positions padded
        return {"input_ids": rng.integers(3, VOCAB, (1, SEQ)).astype(np.int64), "attention_mask": mask}
    if name in WAVEFORMS:
        return {"input_values": rng.standard_normal((1, SAMPLES), dtype=np.float32)}
    return {"pixel_values": rng.standard_normal((1, 3, IMAGE, IMAGE), dtype=np.float32)}


def _calibrate(model: Any, rng: np.random.Generator) -> None:
    """Batch-norm statistics from random batches: at init a batch norm is the identity."""
    if not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(pixel_values=torch.from_numpy(rng.standard_normal((4, 3, IMAGE, IMAGE), dtype=np.float32)))


@pytest.mark.parametrize("name", [*TEXT, *IMAGES, *WAVEFORMS])
def test_architecture_matches_pytorch(name):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = {**TEXT, **IMAGES, **WAVEFORMS}[name]()
    _calibrate(model, rng)
    feeds = [_inputs(name, rng) for _ in range(2)]
    module = _LastHidden(model.eval(), list(feeds[0])).eval()
    args = [tuple(torch.from_numpy(v) for v in f.values()) for f in feeds]
    with torch.no_grad():
        want = [module(*a).numpy() for a in args]
    assert not np.allclose(want[0], want[1], rtol=1e-3, atol=1e-4), "the reference ignores its input"

    compiled = aicf_tvm.compile(aicf_tvm.from_torch(module, args[0]), target="llvm")
    if name == "modernbert":  # its packed q/k/v view is shared with the rotary path (FuseEmits)
        assert sum(k.kind == "fused_attention" for k in compiled.kernels) == 3
    if name in WAVEFORMS:  # every conv1d became a conv2d over a height of 1
        assert not any("conv1d" in k.name for k in compiled.kernels)
        assert sum("conv2d" in k.name for k in compiled.kernels) >= 4  # 3 feature layers, the positional one
    for f, expected in zip(feeds, want):
        got = compiled(*f.values())
        got = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=3e-5 * float(np.abs(expected).max()))
