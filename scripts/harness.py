"""What the benchmark, A/B and profiling scripts share, in one importable module.

Run every script from the repository root as a module, ``python -m scripts.NAME ARGS``:
Python then puts the root on ``sys.path``, so this module (``scripts.harness``), our
packages and ``tests`` import without path edits, and no script imports another.

* models: the ``transformers`` models of ``bench_peers`` (``build``; ``ab_model`` adds the
  A/B runs' two), random weights (seeded), each with two input sets that must give two
  outputs;
* dynamic-shape text models (``text_model``, ``token_inputs``, ``compile_text``) of
  ``bench_dynamic`` and ``profile_dynamic``;
* timing loops (``best_seconds``, ``interleaved_best``);
* the A/B runs: a model built under each side's ``CompileOptions``, the builds called in
  turn in one process (``compare_sides``, ``compare_main``, ``old_new_main``);
* the Adam benchmark's MLP (``MLP_SHAPES``, ``HYPER``), which the device-check bundle also runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from aicf_tvm import CompileOptions

# ------------------------------------------------------------------------- models

TRANSFORMERS = ("bert", "gpt2", "llama", "vit")
CONVNETS = ("resnet50", "mobilenetv2", "convnext")
# Architectures no issue names, for checking the class: ``--models class`` runs them all.
CLASS = ("distilbert", "roberta", "qwen2", "mistral", "phi", "gptneo", "deit", "swin",
         "efficientnet", "regnet", "albert", "electra", "opt", "bloom", "gemma", "t5", "beit",
         "clip", "dinov2", "siglip", "modernbert", "qwen3", "wav2vec2", "whisper")
SEQ = 128


# convolutional networks that take any image size: ``resnet50@299`` is ResNet-50 at 299 px
SIZED = ("resnet50", "mobilenetv2", "convnext", "efficientnet", "regnet")


def model_name(name: str) -> str:
    """An ``argparse`` type: ``name`` if ``build`` knows it (or ``class``, all of ``CLASS``)."""
    base, at, size = name.partition("@")
    known = base in (*TRANSFORMERS, *CONVNETS, *CLASS) or name == "class"
    if not known or (at and (base not in SIZED or not size.isdigit() or int(size) < 32)):
        raise argparse.ArgumentTypeError(f"unknown model {name!r} (a size only for {', '.join(SIZED)}, >= 32 px)")
    return name


@dataclass
class Model:
    """A torch module returning one tensor, its example inputs, and their names."""

    name: str
    module: Any
    inputs: tuple
    names: tuple[str, ...]
    other_inputs: tuple = ()  # a second input set: the output must differ


def _text(name: str, model: Any, vocab: int, seq: int, mask: bool) -> Model:
    import torch

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (1, seq), generator=gen)
    other = torch.randint(0, vocab, (1, seq), generator=gen)
    ones = torch.ones((1, seq), dtype=torch.int64)

    class Text(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any = None) -> Any:
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    if mask:
        return Model(name, Text().eval(), (ids, ones), ("input_ids", "attention_mask"), (other, ones))
    return Model(name, Text().eval(), (ids,), ("input_ids",), (other,))


def _image(name: str, model: Any, size: int = 224, calibrate: bool = False) -> Model:
    import torch

    gen = torch.Generator().manual_seed(2)
    if calibrate:  # batch-norm at init is the identity up to 1e-5: outputs would not depend on x
        for mod in model.modules():
            if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
                mod.reset_running_stats()
                mod.momentum = None  # a cumulative average over the calibration batches
        model.train()
        with torch.no_grad():
            for _ in range(3):
                model(pixel_values=torch.randn((4, 3, size, size), generator=gen))
    model.eval()

    class Image(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: Any) -> Any:
            out = self.model(pixel_values=pixel_values)
            return out.logits if hasattr(out, "logits") else out.last_hidden_state

    x = torch.randn((1, 3, size, size), generator=gen)
    y = torch.randn((1, 3, size, size), generator=gen)
    return Model(name, Image().eval(), (x,), ("pixel_values",), (y,))


def _audio(name: str, model: Any, shape: tuple[int, ...], key: str) -> Model:
    """An audio encoder on random input of ``shape``: ``key`` the raw samples
    (``input_values``) or the log-mel frames (``input_features``)."""
    import torch

    gen = torch.Generator().manual_seed(3)

    class Audio(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, features: Any) -> Any:
            return self.model(**{key: features}).last_hidden_state

    x, y = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    return Model(name, Audio().eval(), (x,), (key,), (y,))


def build(name: str, seq: int, calibrate: bool = True) -> Model:
    """The model ``name`` (``NAME@SIZE``: a convnet of ``SIZED`` at SIZE px), text models
    at ``seq`` tokens; ``calibrate=False`` leaves a convnet's batch norms at init (for
    ``NAME@SIZE``, which calibrates them at SIZE)."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    base, _, size = name.partition("@")
    if size:
        model = build(base, seq, calibrate=False)
        return _image(name, model.module.model, size=int(size), calibrate=True)
    if name == "bert":
        return _text(name, tf.BertModel(tf.BertConfig()), 30522, seq, mask=True)
    if name == "gpt2":
        return _text(name, tf.GPT2Model(tf.GPT2Config()), 50257, seq, mask=True)
    if name == "llama":
        config = tf.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                                num_attention_heads=16, num_key_value_heads=4, vocab_size=32000)
        return _text(name, tf.LlamaModel(config), 32000, seq, mask=True)
    if name == "vit":
        return _image(name, tf.ViTModel(tf.ViTConfig(), add_pooling_layer=False))
    if name == "resnet50":
        return _image(name, tf.ResNetForImageClassification(tf.ResNetConfig()), calibrate=calibrate)
    if name == "mobilenetv2":
        return _image(name, tf.MobileNetV2ForImageClassification(tf.MobileNetV2Config()), calibrate=calibrate)
    if name == "convnext":
        return _image(name, tf.ConvNextForImageClassification(tf.ConvNextConfig()))
    return _class_model(name, seq, calibrate)


def _class_model(name: str, seq: int, calibrate: bool = True) -> Model:
    """The architectures of ``CLASS``: default configs (ALBERT at base size), decoders and
    the T5 encoder at small sizes (4-6 layers)."""
    import transformers as tf

    small = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4, "num_attention_heads": 16}
    if name == "distilbert":
        return _text(name, tf.DistilBertModel(tf.DistilBertConfig()), 30522, seq, mask=True)
    if name == "roberta":
        return _text(name, tf.RobertaModel(tf.RobertaConfig(), add_pooling_layer=False), 50265, seq, mask=True)
    if name == "qwen2":
        config = tf.Qwen2Config(**small, num_key_value_heads=2, vocab_size=32000)
        return _text(name, tf.Qwen2Model(config), 32000, seq, mask=True)
    if name == "mistral":
        config = tf.MistralConfig(**small, num_key_value_heads=8, vocab_size=32000)
        return _text(name, tf.MistralModel(config), 32000, seq, mask=True)
    if name == "phi":
        config = tf.PhiConfig(**small, vocab_size=32000)
        return _text(name, tf.PhiModel(config), 32000, seq, mask=True)
    if name == "gptneo":
        config = tf.GPTNeoConfig(hidden_size=768, num_layers=4, num_heads=12,
                                 attention_types=[[["global", "local"], 2]], vocab_size=32000)
        return _text(name, tf.GPTNeoModel(config), 32000, seq, mask=True)
    if name == "albert":
        config = tf.AlbertConfig(hidden_size=768, num_attention_heads=12, intermediate_size=3072)  # base
        return _text(name, tf.AlbertModel(config, add_pooling_layer=False), 30000, seq, mask=True)
    if name == "electra":
        return _text(name, tf.ElectraModel(tf.ElectraConfig()), 30522, seq, mask=True)
    if name == "opt":
        config = tf.OPTConfig(hidden_size=768, ffn_dim=3072, num_hidden_layers=4, num_attention_heads=12,
                              word_embed_proj_dim=768, vocab_size=32000)
        return _text(name, tf.OPTModel(config), 32000, seq, mask=True)
    if name == "bloom":  # ALiBi position bias
        config = tf.BloomConfig(hidden_size=1024, n_layer=4, n_head=16, vocab_size=32000)
        return _text(name, tf.BloomModel(config), 32000, seq, mask=True)
    if name == "gemma":
        config = tf.GemmaConfig(**small, num_key_value_heads=4, head_dim=64, vocab_size=32000)
        return _text(name, tf.GemmaModel(config), 32000, seq, mask=True)
    if name == "t5":  # the encoder: relative position buckets, RMS norm without mean
        config = tf.T5Config(d_model=512, d_ff=2048, num_layers=6, num_heads=8, vocab_size=32128)
        return _text(name, tf.T5EncoderModel(config), 32128, seq, mask=True)
    if name == "deit":
        return _image(name, tf.DeiTModel(tf.DeiTConfig(), add_pooling_layer=False))
    if name == "beit":  # relative position bias in every layer
        return _image(name, tf.BeitModel(tf.BeitConfig(use_relative_position_bias=True), add_pooling_layer=False))
    if name == "clip":
        return _image(name, tf.CLIPVisionModel(tf.CLIPVisionConfig()))
    if name == "dinov2":  # 224 px at patch 14: 257 tokens, layer scale
        return _image(name, tf.Dinov2Model(tf.Dinov2Config()))
    if name == "siglip":  # 224 px at patch 16: 196 tokens, tanh GELU
        return _image(name, tf.SiglipVisionModel(tf.SiglipVisionConfig()))
    if name == "modernbert":  # base size (22 layers): GeGLU, alternating local/global attention
        config = tf.ModernBertConfig(pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                                     sep_token_id=2)
        return _text(name, tf.ModernBertModel(config), config.vocab_size, seq, mask=True)
    if name == "qwen3":  # q/k RMS norms per head
        config = tf.Qwen3Config(**small, num_key_value_heads=4, head_dim=64, vocab_size=32000)
        return _text(name, tf.Qwen3Model(config), 32000, seq, mask=True)
    if name == "wav2vec2":  # base size, 1 s at 16 kHz: a 7-layer conv1d feature encoder, 49 frames
        return _audio(name, tf.Wav2Vec2Model(tf.Wav2Vec2Config()), (1, 16000), "input_values")
    if name == "whisper":  # the encoder at its default (tiny) size: 30 s of 80 mel bins, 1500 frames
        return _audio(name, tf.WhisperModel(tf.WhisperConfig()).get_encoder(), (1, 80, 3000), "input_features")
    if name == "swin":
        return _image(name, tf.SwinForImageClassification(tf.SwinConfig()))
    if name == "efficientnet":
        return _image(name, tf.EfficientNetForImageClassification(tf.EfficientNetConfig()), calibrate=calibrate)
    if name == "regnet":
        return _image(name, tf.RegNetForImageClassification(tf.RegNetConfig()), calibrate=calibrate)
    raise SystemExit(f"unknown model {name!r}")


def ab_model(name: str, seq: int = 128) -> Model:
    """The A/B scripts' models: one of ``build`` (``resnet50@299``: a convnet at another
    size), or ``distilbert`` (at 128 tokens) or ``qwen2`` (a 3-layer Qwen2-style decoder:
    hidden 896, 14 heads, 2 key/value heads, at 96 tokens)."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    if name == "distilbert":
        return _text(name, tf.DistilBertModel(tf.DistilBertConfig()), 30522, 128, mask=True)
    if name == "qwen2":
        config = tf.Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=3,
                                num_attention_heads=14, num_key_value_heads=2, vocab_size=32000)
        return _text(name, tf.Qwen2Model(config), 32000, 96, mask=True)
    return build(name, seq)


# ------------------------------------------------------------ A/B in one process

BUILDS, PAIRS = 2, 24


def compare_sides(name: str, sides: dict[str, CompileOptions], seq: int = 128) -> str:
    """``name`` built ``BUILDS`` times with each side's options (the first side is the
    base), the builds' calls interleaved for ``PAIRS`` rounds (the order reversed every
    other round); per side its median time, the median over rounds of its time over the
    base's, its error against PyTorch and whether its output has the base's bits.
    ``seq``: the sequence length of a text model (``build``)."""
    import torch

    import aicf_tvm

    model = ab_model(name, seq)
    mod = aicf_tvm.from_torch(model.module, model.inputs)
    inputs = [t.numpy() for t in model.inputs]
    with torch.no_grad():
        want = model.module(*model.inputs).numpy()
        other = model.module(*model.other_inputs).numpy()
    if np.array_equal(want, other):
        raise SystemExit(f"{name}: two different inputs give the same output; no check possible")
    builds = {label: [aicf_tvm.compile(mod, target="llvm", options=options) for _ in range(BUILDS)]
              for label, options in sides.items()}
    outputs = {label: np.asarray(compiled[0](*inputs)) for label, compiled in builds.items()}
    for compiled in (c for side in builds.values() for c in side):
        compiled(*inputs)  # every build called once before the timed rounds
    base = next(iter(sides))
    scale = float(np.abs(want).max())
    times: dict[str, list[float]] = {label: [] for label in sides}
    for turn in range(PAIRS):
        for label in list(sides) if turn % 2 == 0 else list(sides)[::-1]:
            compiled = builds[label][turn % BUILDS]
            start = time.perf_counter()
            compiled(*inputs)
            times[label].append(time.perf_counter() - start)
    parts = [f"{name:12s}"]
    for label in sides:
        ratio = statistics.median(t / b for t, b in zip(times[label], times[base]))
        error = float(np.abs(outputs[label] - want).max()) / scale
        same = "same bits" if np.array_equal(outputs[label], outputs[base]) else "other bits"
        median = 1e3 * statistics.median(times[label])
        parts.append(f"{label} {median:.2f} ms ({ratio:.3f}, {error:.1e}, {same})")
    return "  ".join(parts)


def compare_main(doc: str, sides: dict[str, CompileOptions], models: list[str], seq: int) -> None:
    """A comparison script's main: MODEL ... and ``--seq`` from the command line, each
    model's sides compared by ``compare_sides``, one line per model."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=models)
    parser.add_argument("--seq", type=int, default=seq, help="the text models' length")
    args = parser.parse_args()
    for name in args.models:
        print(f"seq {args.seq:<5d} {compare_sides(name, sides, seq=args.seq)}", flush=True)


def old_new_main(doc: str, old: CompileOptions, models: list[str], seq: int = 128) -> None:
    """``compare_main`` of two sides: "old" built with the options ``old``, "new" with the
    default ones (the default build)."""
    from aicf_tvm import CompileOptions

    compare_main(doc, {"old": old, "new": CompileOptions()}, models, seq)


# ------------------------------------------------------ dynamic-shape text models


@dataclass
class TextModel:
    """A torch module ``(input_ids, attention_mask) -> last_hidden_state`` and its vocabulary."""

    name: str
    module: Any
    vocab: int


def text_model(name: str, small: bool) -> TextModel:
    """A BERT encoder, GPT-2 or a LLaMA-style decoder (4 layers; ``small``: 1 layer, hidden
    128), random weights (seeded), for compiles with a dynamic batch and sequence."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    if name == "bert":
        size = dict(hidden_size=128, num_attention_heads=2, intermediate_size=512) if small else {}
        config = tf.BertConfig(num_hidden_layers=1 if small else 4, **size)
        inner = tf.BertModel(config)
    elif name == "gpt2":
        size = dict(n_embd=128, n_head=2) if small else dict(n_embd=512, n_head=8)
        config = tf.GPT2Config(n_layer=1 if small else 4, n_positions=512, **size)
        inner = tf.GPT2Model(config)
    else:
        size = (dict(hidden_size=128, intermediate_size=344, num_attention_heads=2, num_key_value_heads=1)
                if small else dict(hidden_size=512, intermediate_size=1376, num_attention_heads=8,
                                   num_key_value_heads=4))
        config = tf.LlamaConfig(num_hidden_layers=1 if small else 4, vocab_size=4000,
                                max_position_embeddings=512, **size)
        inner = tf.LlamaModel(config)

    class Text(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = inner

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return TextModel(name, Text().eval(), config.vocab_size)


def token_inputs(model: TextModel, batch: int, seq: int, seed: int) -> tuple[Any, Any]:
    """Random token ids ``[batch, seq]`` (from ``seed``) and the all-ones attention mask."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.vocab, (batch, seq), generator=gen), torch.ones((batch, seq), dtype=torch.int64)


def compile_text(model: TextModel, example: tuple, dynamic: bool) -> Any:
    """Ours for ``example``'s shapes, or (``dynamic``) for ``Dim("batch", max=8)`` x
    ``Dim("seq", max=512)``."""
    import torch

    import aicf_tvm

    shapes = None
    if dynamic:
        dims = {0: torch.export.Dim("batch", max=8), 1: torch.export.Dim("seq", max=512)}
        shapes = (dims, dims)
    return aicf_tvm.compile(aicf_tvm.from_torch(model.module, example, dynamic_shapes=shapes), target="llvm")


# ------------------------------------------------------------------ timing


def best_seconds(run, repeat: int) -> float:
    """Minimum seconds per call over ``repeat`` timeit repeats of ~0.2 s each."""
    return interleaved_best({"run": run}, repeat)["run"]


def interleaved_best(runs: dict, repeat: int) -> dict:
    """Per run, the minimum seconds per call over ``repeat`` rounds of ~0.2 s, the runs
    taking turns within each round: load on this shared machine then falls on all of them
    alike instead of on whichever ran at the time (one cell of a sequential run moved
    by 1.4x between runs)."""
    calls = {}
    for name, run in runs.items():
        run()
        calls[name] = max(1, int(0.2 / max(timeit.timeit(run, number=1), 1e-6)))
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeat):
        for name, run in runs.items():
            best[name] = min(best[name], timeit.timeit(run, number=calls[name]) / calls[name])
    return best


# ------------------------------------------------------------ the Adam MLP

# 784 -> 2048 -> 2048 -> 1600 -> 10-ish MLP weights and biases: 10,032,704 parameters.
MLP_SHAPES = [(2048, 2048), (2048,), (2048, 2048), (2048,), (1024, 1600), (1600,)]
HYPER = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
