"""Real `transformers` architectures, small random configs, through PyTorch and through ONNX.

    python -m scripts.sweep_models [--only NAME ...] [--paths torch onnx] [--jobs 1]
                                   [--timeout 900] [--json sweep.json] [--no-tvm] [--seq 8]

Rows: each model (tiny: 2 layers, hidden 64-128, images 32 px), decoders both without and
with an attention mask (``NAME+mask``: the last two positions padded), text models at
``--seq`` tokens (8 by default; 32 or 64 are whole tiles of attention's keys with AVX-512,
which then runs in one pass), each on two paths:

* ``torch``: ``aicf_tvm.from_torch`` against PyTorch eager;
* ``onnx``: ``torch.onnx.export`` (TorchScript exporter, opset 17; opset 18 where 17
  has no export of an op, as MobileViTV2's ``col2im``; PyTorch's dynamo exporter where
  the TorchScript one fails, as on Cohere's rotary code: ``_export_onnx``), then
  ``aicf_tvm.from_onnx`` against ONNX Runtime.

Beside ours, TVM alone on the same path: its own frontend
(``relax.frontend.torch.from_exported_program`` / ``relax.frontend.onnx.from_onnx``) and
its default pipeline (``relax.get_default_pipeline``: the CPU backend's dispatch + legalize
stages, whose ``call_tir`` count is TVM's kernel count, then dataflow-lower + finalize).
Weights are random (``torch.manual_seed``); batch-norm statistics are calibrated on random
batches (train mode, cumulative averages) so no layer is input-independent, and every row
checks that two different inputs give two different reference outputs. Rel err: max |got -
want| / max |want| over both inputs; right means <= 1e-3. A row whose reference cannot be
made (the model itself fails, or every ONNX exporter does) reads ``no reference`` and is
not counted against either compiler.
Every (model, path) runs in its own subprocess under ``--timeout``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

TOLERANCE = 1e-3
SEQ, VOCAB, IMAGE = 8, 100, 32
# wav2vec2-style encoders: 3 feature layers of 32 channels (400 samples -> 79 -> 39 -> 19
# frames), 16-tap positional convolution in 4 groups, 2 layers of hidden 64
WAVE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
WAVE_SAMPLES = 400
TEXT = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=64)
DECODER = dict(TEXT, num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _configs() -> dict[str, tuple[str, Callable[[], Any]]]:
    """name -> (input kind, builder of the module): text, decoder, image, audio."""
    import transformers as T

    def whisper():
        cfg = T.WhisperConfig(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2,
                              encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                              decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=16, max_target_positions=16,
                              pad_token_id=0,
                              bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
        return T.WhisperModel(cfg).encoder

    return {
        "bert": ("text", lambda: T.BertModel(T.BertConfig(**TEXT))),
        "distilbert": ("text", lambda: T.DistilBertModel(T.DistilBertConfig(
            vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=64))),
        "deberta-v2": ("text", lambda: T.DebertaV2Model(T.DebertaV2Config(
            **TEXT, relative_attention=True, position_buckets=16, pos_att_type=["p2c", "c2p"]))),
        "t5-encoder": ("text", lambda: T.T5EncoderModel(T.T5Config(
            vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4))),
        "gpt2": ("decoder", lambda: T.GPT2Model(T.GPT2Config(
            vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2))),
        "gpt-neox": ("decoder", lambda: T.GPTNeoXModel(T.GPTNeoXConfig(**DECODER))),
        "opt": ("decoder", lambda: T.OPTModel(T.OPTConfig(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
            max_position_embeddings=64, word_embed_proj_dim=64, pad_token_id=0, bos_token_id=1, eos_token_id=2))),
        "llama": ("decoder", lambda: T.LlamaModel(T.LlamaConfig(**DECODER))),
        "mistral": ("decoder", lambda: T.MistralModel(T.MistralConfig(**DECODER))),
        "qwen2": ("decoder", lambda: T.Qwen2Model(T.Qwen2Config(**DECODER))),
        "gemma": ("decoder", lambda: T.GemmaModel(T.GemmaConfig(**dict(DECODER, num_key_value_heads=1), head_dim=16))),
        "phi3": ("decoder", lambda: T.Phi3Model(T.Phi3Config(**DECODER))),
        "falcon": ("decoder", lambda: T.FalconModel(T.FalconConfig(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, multi_query=True,
            new_decoder_architecture=False, bos_token_id=1, eos_token_id=2))),
        "whisper-encoder": ("audio", whisper),
        # raw samples: a conv1d feature encoder (strides 5, 2, 2), a grouped positional conv1d
        "wav2vec2": ("waveform", lambda: T.Wav2Vec2Model(T.Wav2Vec2Config(**WAVE))),
        "hubert": ("waveform", lambda: T.HubertModel(T.HubertConfig(**WAVE))),
        "albert": ("text", lambda: T.AlbertModel(T.AlbertConfig(**TEXT, embedding_size=32))),
        "electra": ("text", lambda: T.ElectraModel(T.ElectraConfig(**TEXT, embedding_size=32))),
        "roberta": ("text", lambda: T.RobertaModel(T.RobertaConfig(**TEXT, pad_token_id=1))),
        "mpnet": ("text", lambda: T.MPNetModel(T.MPNetConfig(**TEXT))),
        "mobilebert": ("text", lambda: T.MobileBertModel(T.MobileBertConfig(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            embedding_size=32, intra_bottleneck_size=32, true_hidden_size=32, num_feedforward_networks=2,
            max_position_embeddings=64))),
        "squeezebert": ("text", lambda: T.SqueezeBertModel(T.SqueezeBertConfig(**TEXT, embedding_size=64))),
        "roformer": ("text", lambda: T.RoFormerModel(T.RoFormerConfig(**TEXT, embedding_size=64))),
        "modernbert": ("text", lambda: T.ModernBertModel(T.ModernBertConfig(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=64, local_attention=4, global_attn_every_n_layers=2,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2))),
        "bart-encoder": ("text", lambda: T.BartModel(T.BartConfig(
            vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)).encoder),
        "bloom": ("decoder", lambda: T.BloomModel(T.BloomConfig(
            vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4, pad_token_id=0, bos_token_id=1, eos_token_id=2))),
        "gpt-bigcode": ("decoder", lambda: T.GPTBigCodeModel(T.GPTBigCodeConfig(
            vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, multi_query=True,
            bos_token_id=1, eos_token_id=2))),
        "gptj": ("decoder", lambda: T.GPTJModel(T.GPTJConfig(
            vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, rotary_dim=8,
            bos_token_id=1, eos_token_id=2))),
        "codegen": ("decoder", lambda: T.CodeGenModel(T.CodeGenConfig(
            vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, n_ctx=64, rotary_dim=8,
            bos_token_id=1, eos_token_id=2))),
        "stablelm": ("decoder", lambda: T.StableLmModel(T.StableLmConfig(**DECODER))),
        "qwen3": ("decoder", lambda: T.Qwen3Model(T.Qwen3Config(**DECODER, head_dim=16))),
        "olmo2": ("decoder", lambda: T.Olmo2Model(T.Olmo2Config(**DECODER))),
        "granite": ("decoder", lambda: T.GraniteModel(T.GraniteConfig(**DECODER, embedding_multiplier=2.0,
                                                                      residual_multiplier=0.5,
                                                                      attention_multiplier=0.25))),
        "phi": ("decoder", lambda: T.PhiModel(T.PhiConfig(**DECODER))),
        "gemma2": ("decoder", lambda: T.Gemma2Model(T.Gemma2Config(
            **DECODER, head_dim=16, sliding_window=4, attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0))),
        "starcoder2": ("decoder", lambda: T.Starcoder2Model(T.Starcoder2Config(**DECODER))),
        "cohere": ("decoder", lambda: T.CohereModel(T.CohereConfig(**DECODER))),
        "deit": ("image", lambda: T.DeiTModel(T.DeiTConfig(
            image_size=IMAGE, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128), add_pooling_layer=False)),
        "beit": ("image", lambda: T.BeitModel(T.BeitConfig(
            image_size=IMAGE, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, use_relative_position_bias=True), add_pooling_layer=False)),
        "dinov2": ("image", lambda: T.Dinov2Model(T.Dinov2Config(
            image_size=IMAGE, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            mlp_ratio=2))),
        "clip-vision": ("image", lambda: T.CLIPVisionModel(T.CLIPVisionConfig(
            image_size=IMAGE, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128))),
        "siglip-vision": ("image", lambda: T.SiglipVisionModel(T.SiglipVisionConfig(
            image_size=IMAGE, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128))),
        "segformer": ("image", lambda: T.SegformerModel(T.SegformerConfig(
            num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3],
            strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2]))),
        "mobilevit": ("image", lambda: T.MobileViTModel(T.MobileViTConfig(
            image_size=IMAGE, hidden_sizes=[32, 40, 48], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64]),
            expand_output=False)),
        "levit": ("image", lambda: T.LevitModel(T.LevitConfig(
            image_size=IMAGE, patch_size=16, hidden_sizes=[32, 48, 64], num_attention_heads=[1, 2, 2], depths=[1, 1, 1],
            key_dim=[8, 8, 8]))),
        "poolformer": ("image", lambda: T.PoolFormerModel(T.PoolFormerConfig(
            hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1]))),
        "convnextv2": ("image", lambda: T.ConvNextV2Model(T.ConvNextV2Config(
            num_stages=2, hidden_sizes=[16, 32], depths=[1, 1]))),
        "regnet": ("image", lambda: T.RegNetModel(T.RegNetConfig(
            embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8))),
        "vit": ("image", lambda: T.ViTModel(T.ViTConfig(
            image_size=IMAGE, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128))),
        "swin": ("image", lambda: T.SwinModel(T.SwinConfig(
            image_size=IMAGE, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4))),
        "convnext": ("image", lambda: T.ConvNextModel(T.ConvNextConfig(
            num_stages=2, hidden_sizes=[16, 32], depths=[1, 1]))),
        "resnet": ("image", lambda: T.ResNetModel(T.ResNetConfig(
            embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic"))),
        "mobilenet-v2": ("image", lambda: T.MobileNetV2Model(T.MobileNetV2Config(
            image_size=IMAGE, depth_multiplier=0.35))),
        "efficientnet": ("image", lambda: T.EfficientNetModel(T.EfficientNetConfig(
            image_size=IMAGE, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320))),
        # E20's held-out failures: a negative-step arange (Funnel), F.unfold (MobileViTV2,
        # ConvBERT), boolean-mask assignment (Longformer)
        "funnel": ("text", lambda: T.FunnelModel(T.FunnelConfig(
            vocab_size=VOCAB, block_sizes=[1, 1], d_model=64, n_head=4, d_head=16, d_inner=128))),
        "mobilevitv2": ("image64", lambda: T.MobileViTV2Model(T.MobileViTV2Config(
            image_size=2 * IMAGE, width_multiplier=0.25), expand_output=False)),
        "convbert": ("text", lambda: T.ConvBertModel(T.ConvBertConfig(**TEXT, embedding_size=64))),
        "longformer": ("text", lambda: T.LongformerModel(T.LongformerConfig(
            **TEXT, attention_window=4, pad_token_id=1))),
    }


def rows() -> list[str]:
    return [name + suffix for name, (kind, _) in _configs().items()
            for suffix in (("", "+mask") if kind == "decoder" else ("",))]


# --- one row, in a worker process --------------------------------------------------------

def _inputs(kind: str, masked: bool, model: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    if kind in ("text", "decoder"):
        feeds = {"input_ids": rng.integers(3, VOCAB, (1, SEQ)).astype(np.int64)}
        if masked:
            feeds["attention_mask"] = np.array([[1] * (SEQ - 2) + [0, 0]], dtype=np.int64)
        return feeds
    if kind == "waveform":
        return {"input_values": rng.standard_normal((1, WAVE_SAMPLES), dtype=np.float32)}
    if kind == "audio":
        cfg = model.config
        return {"input_features": rng.standard_normal((1, cfg.num_mel_bins, 2 * cfg.max_source_positions),
                                                      dtype=np.float32)}
    size = 2 * IMAGE if kind == "image64" else IMAGE  # image64: a model that downsamples 32 px to nothing
    return {"pixel_values": rng.standard_normal((1, 3, size, size), dtype=np.float32)}


def _calibrate(model: Any, rng: np.random.Generator, size: int = IMAGE) -> None:
    """Batch-norm running statistics from random batches (cumulative average). The affine
    parameters are redrawn first, scale in [0.5, 1.5]: some inits (EfficientNet's) draw
    the scale ~ N(0, 0.02), and activations then vanish by 1e-4 per block until every
    input gives the same (zero) output."""
    import torch

    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    with torch.no_grad():
        for m in norms:
            m.reset_running_stats()
            m.momentum = None
            if m.affine:
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(torch.from_numpy(rng.standard_normal((4, 3, size, size), dtype=np.float32)))
    model.eval()


def wrap(model: Any, names: list[str]) -> Any:
    """A module ``forward(*inputs) -> last_hidden_state`` over a transformers model."""
    import inspect

    import torch

    no_cache = "use_cache" in inspect.signature(model.forward).parameters

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args):
            kwargs = dict(zip(names, args), **({"use_cache": False} if no_cache else {}))
            out = self.model(**kwargs)
            return out[0] if isinstance(out, tuple) else out.last_hidden_state

    return Wrapper().eval()


def _register_export_fixes() -> None:
    """Two ops the TorchScript ONNX exporter gets wrong in transformers' mask code (the
    packed-sequence check ``(torch.diff(position_ids, prepend=...) != 1).cumsum(-1)``, run
    when no mask is given): it has no ``aten::diff``, and it exports ``cumsum`` of a bool
    tensor as a bool ``CumSum``, which ONNX does not allow (PyTorch sums in int64). And
    its opset-18 ``col2im`` (``F.fold``) reads the output size as a tensor's shape, which
    MobileViTV2's Python ints are not: written here as ONNX's ``Col2Im`` of constants."""
    import torch
    from torch.onnx import symbolic_helper as sh
    from torch.onnx._internal.torchscript_exporter import symbolic_opset11

    def const(g, v):
        return g.op("Constant", value_t=torch.tensor([v]))

    def diff(g, x, n, dim, prepend, append):
        if sh._get_const(n, "i", "n") != 1:
            raise RuntimeError("the sweep's aten::diff handles n=1 only")
        d = sh._get_const(dim, "i", "dim")
        x = g.op("Concat", *[v for v in (prepend, x, append) if not sh._is_none(v)], axis_i=d)
        head = g.op("Slice", x, const(g, 1), const(g, 2**62), const(g, d))
        return g.op("Sub", head, g.op("Slice", x, const(g, 0), const(g, -1), const(g, d)))

    def cumsum(g, x, dim, dtype=None):
        integral = x.type().scalarType() in ("Bool", "Byte", "Char", "Short", "Int")
        if integral and (dtype is None or sh._is_none(dtype)):
            x = g.op("Cast", x, to_i=7)  # TensorProto.INT64
        return symbolic_opset11.cumsum(g, x, dim, dtype)

    @sh.parse_args("v", "is", "is", "is", "is", "is")
    def col2im(g, x, output_size, kernel_size, dilation, padding, stride):
        image = g.op("Constant", value_t=torch.tensor(output_size, dtype=torch.int64))
        block = g.op("Constant", value_t=torch.tensor(kernel_size, dtype=torch.int64))
        return g.op("Col2Im", x, image, block, dilations_i=dilation, pads_i=[*padding, *padding], strides_i=stride)

    torch.onnx.register_custom_op_symbolic("aten::col2im", col2im, 18)
    torch.onnx.register_custom_op_symbolic("aten::diff", diff, 17)
    torch.onnx.register_custom_op_symbolic("aten::cumsum", cumsum, 17)


def _export_onnx(module: Any, args: tuple, file: str, names: list[str]) -> str:
    """``torch.onnx.export`` as the module docstring says; returns which exporter wrote
    ``file``: the TorchScript one at opset 17, at 18 where 17 has no export of an op, else
    (where the TorchScript exporter itself fails: Cohere's rotary code trips its shape
    inference) the ``torch.export``-based one (``dynamo=True``, needs ``onnxscript``)."""
    import torch

    errors = []
    for opset in (17, 18):  # 18 exports col2im (F.fold)
        try:
            with torch.no_grad():
                torch.onnx.export(module, args, file, dynamo=False, opset_version=opset, input_names=names,
                                  output_names=["out"])
            return f"torchscript, opset {opset}"
        except torch.onnx.errors.UnsupportedOperatorError as err:
            errors.append(err)
        except RuntimeError as err:
            errors.append(err)
            break
    try:
        import onnxscript  # noqa: F401 - the dynamo exporter's dependency
    except ImportError:
        raise errors[-1] from None
    with torch.no_grad():
        torch.onnx.export(module, args, file, dynamo=True, input_names=names, output_names=["out"],
                          external_data=False, verbose=False)
    return "dynamo"


def _rel_err(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    worst = 0.0
    for g, w in zip(got, want):
        g, w = np.asarray(g, dtype=np.float64), np.asarray(w, dtype=np.float64)
        if g.shape != w.shape:
            return float("inf")
        err = np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-30)
        worst = max(worst, float(err) if np.isfinite(err) else float("inf"))
    return worst


def _attempt(fn: Callable[[], tuple[list[np.ndarray], int]], want: list[np.ndarray]) -> dict:
    start = time.time()
    try:
        got, kernels = fn()
    except Exception as err:  # noqa: BLE001 - every failure is a row status
        lines = [ln for ln in str(err).splitlines() if ln.strip()]
        detail = next((ln for ln in lines if "Check failed" in ln or "Error" in ln), lines[0] if lines else "")
        return {"status": "error", "reason": f"{type(err).__name__}: {detail.strip()[:240]}",
                "trace": traceback.format_exc()[-2000:], "seconds": round(time.time() - start, 1)}
    err = _rel_err(got, want)
    return {"status": "ok" if err <= TOLERANCE else "WRONG", "rel_err": err, "kernels": kernels,
            "seconds": round(time.time() - start, 1)}


def _tvm_build(mod: Any, target: Any) -> tuple[Any, int]:
    import tvm
    from tvm import relax
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    from relax_passes.lower_emits import kernel_calls

    with target:
        mod = tvm.transform.Sequential([*cpu.library_dispatch_passes(target), *cpu.legalize_passes(target)])(mod)
    kernels = len(kernel_calls(mod["main"]))
    rest = tvm.transform.Sequential([*cpu.dataflow_lower_passes(target), *cpu.finalize_passes(target)])
    with target:
        ex = tvm.compile(mod, target=target, relax_pipeline=rest)
    return relax.VirtualMachine(ex, tvm.cpu()), kernels


def _run_vm(vm: Any, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    import tvm

    outs = []
    for f in feeds:
        out = vm["main"](*[tvm.runtime.tensor(v) for v in f.values()])
        outs.append((out[0] if not hasattr(out, "numpy") else out).numpy())
    return outs


def run_row(row: str, path: str, with_tvm: bool) -> dict:
    """One row: the reference outputs, then ours (and TVM alone) against them.  When the
    reference cannot be made (the model or PyTorch's ONNX exporter fails), the row says
    so (status ``no reference``) instead of blaming either compiler."""
    try:
        return _run_row(row, path, with_tvm)
    except _NoReference as err:
        cause = err.__cause__
        lines = [ln for ln in str(cause).splitlines() if ln.strip()]
        missing = {"status": "no reference",
                   "reason": f"{type(cause).__name__}: {(lines[0] if lines else '').strip()[:200]}"}
        return {"model": row, "path": path, "ours": missing, **({"tvm": missing} if with_tvm else {})}


class _NoReference(Exception):
    """The reference side of a row failed (raised from the original error)."""


def _run_row(row: str, path: str, with_tvm: bool) -> dict:
    import torch

    import aicf_tvm
    from aicf_tvm.runtime.targets import resolve_target

    name, masked = row.removesuffix("+mask"), row.endswith("+mask")
    kind, build = _configs()[name]
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = build().eval()
    if kind.startswith("image"):
        _calibrate(model, rng, 2 * IMAGE if kind == "image64" else IMAGE)
    feeds = [_inputs(kind, masked, model, rng) for _ in range(2)]
    names = list(feeds[0])
    module = wrap(model, names)
    args = [tuple(torch.from_numpy(v) for v in f.values()) for f in feeds]
    result: dict = {"model": row, "path": path}
    target = resolve_target("llvm")

    if path == "torch":
        try:
            with torch.no_grad():
                want = [module(*a).numpy() for a in args]
        except Exception as err:
            raise _NoReference() from err

        def ours():
            compiled = aicf_tvm.compile(aicf_tvm.from_torch(module, args[0]), target)
            return [compiled(*f.values()) for f in feeds], len(compiled.kernels)

        def theirs():
            from tvm.relax.frontend.torch import from_exported_program

            with torch.no_grad():
                ep = torch.export.export(module, args[0])
                mod = from_exported_program(ep, keep_params_as_input=False, unwrap_unit_return_tuple=True)
            vm, kernels = _tvm_build(mod, target)
            return _run_vm(vm, feeds), kernels
    else:
        import onnx
        import onnxruntime as ort

        _register_export_fixes()
        try:
            with tempfile.TemporaryDirectory() as tmp:
                file = os.path.join(tmp, "model.onnx")
                result["exporter"] = _export_onnx(module, args[0], file, names)
                proto = onnx.load(file)
            sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
            want = [sess.run(None, f)[0] for f in feeds]
        except Exception as err:
            raise _NoReference() from err
        onnx_inputs = [i.name for i in proto.graph.input]
        feeds = [{k: f[k] for k in onnx_inputs} for f in feeds]  # the exporter drops unused inputs

        def ours():
            compiled = aicf_tvm.compile(aicf_tvm.from_onnx(proto), target)
            return [compiled(**f) for f in feeds], len(compiled.kernels)

        def theirs():
            from tvm import relax

            shapes = {k: list(v.shape) for k, v in feeds[0].items()}
            vm, kernels = _tvm_build(relax.frontend.onnx.from_onnx(proto, shape_dict=shapes), target)
            return _run_vm(vm, feeds), kernels

    result["distinct"] = _rel_err([want[0]], [want[1]]) > TOLERANCE
    result["ours"] = _attempt(ours, want)
    if with_tvm:
        result["tvm"] = _attempt(theirs, want)
    return result


# --- the sweep ---------------------------------------------------------------------------

def _spawn(row: str, path: str, args: argparse.Namespace) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        out = tmp.name
    cmd = [sys.executable, "-m", "scripts.sweep_models", "--worker", row, path, "--json", out, "--seq", str(args.seq)]
    cmd += [] if args.tvm else ["--no-tvm"]
    start = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT, check=False)
        if proc.returncode == 0:
            return json.loads(Path(out).read_text())
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        crash = {"status": "error", "reason": f"worker died (exit {proc.returncode}): {tail[0][:200]}"}
    except subprocess.TimeoutExpired:
        crash = {"status": "timeout", "reason": f"over {args.timeout} s"}
    finally:
        Path(out).unlink(missing_ok=True)
    return {"model": row, "path": path, "ours": crash, "tvm": crash, "seconds": round(time.time() - start, 1)}


def _cell(res: dict | None) -> str:
    if not res:
        return "-"
    if res["status"] in ("ok", "WRONG"):
        return f"{res['status']} {res['rel_err']:.1e}"
    return f"{res['status']}: {res.get('reason', '')[:60]}"


def _kernels(res: dict | None) -> str:
    return str(res["kernels"]) if res and "kernels" in res else "-"


def print_table(results: list[dict]) -> None:
    print(f"{'model':<18} {'path':<6} {'ours':<46} {'TVM':<46} {'kernels ours/TVM':>16}")
    for r in results:
        distinct = "" if r.get("distinct", True) else "  (two inputs gave the same output)"
        print(f"{r['model']:<18} {r['path']:<6} {_cell(r['ours']):<46} {_cell(r.get('tvm')):<46} "
              f"{_kernels(r['ours']) + '/' + _kernels(r.get('tvm')):>16}{distinct}")
    judged = [r for r in results if r["ours"]["status"] != "no reference"]
    right = sum(r["ours"]["status"] == "ok" and r.get("distinct", True) for r in judged)
    tvm_bad = sum(r.get("tvm", {}).get("status") not in (None, "ok") for r in judged)
    unjudged = len(results) - len(judged)
    print(f"\nours right: {right}/{len(judged)}; TVM alone fails (error or wrong): {tvm_bad}/{len(judged)}"
          + (f"; {unjudged} row(s) without a reference (the model or the ONNX export failed)" if unjudged else ""))


def main() -> int:
    global SEQ
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", help="model names (a decoder name selects both its rows)")
    parser.add_argument("--paths", nargs="+", default=["torch", "onnx"], choices=["torch", "onnx"])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=900, help="seconds per (model, path)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--no-tvm", dest="tvm", action="store_false", help="skip TVM's own frontend + pipeline")
    parser.add_argument("--seq", type=int, default=SEQ, help="tokens of the text models' inputs")
    parser.add_argument("--worker", nargs=2, metavar=("ROW", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        SEQ = args.seq
        Path(args.json).write_text(json.dumps(run_row(*args.worker, with_tvm=args.tvm)))
        return 0
    selected = [r for r in rows() if not args.only or r.removesuffix("+mask") in args.only or r in args.only]
    if not selected:
        parser.error(f"--only matches no model; the models: {', '.join(sorted(_configs()))}")
    work = [(row, path) for row in selected for path in args.paths]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = []
        for res in pool.map(lambda rp: _spawn(*rp, args), work):
            results.append(res)
            print(f"  {res['model']:<18} {res['path']:<6} ours {_cell(res['ours'])}  TVM {_cell(res.get('tvm'))}",
                  file=sys.stderr, flush=True)
    print_table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
