"""Built-in example models: a BERT-style encoder layer and a LLaMA-style decoder block.

Both are written with ``tvm.relax.frontend.nn`` and exported to a Relax IRModule whose
``main`` is pure, holds one dataflow block, takes only the activation
``x: [batch, seq, hidden] float32`` and has every weight bound as a Relax constant.
Weights come from ``np.random.default_rng(seed)`` (projections ~ N(0, 0.02²), norm
scales ~ 1 + N(0, 0.02²)), drawn in parameter-declaration order, so a model is a pure
function of its sizes and seed. ``return_params=True`` also returns the weights, keyed by
the nn parameter name (``attn.q_proj.weight``; Linear weights are ``[out, in]`` as in
PyTorch), for reference implementations (numpy in the tests, ONNX in ``models_onnx``).

Only tvm, numpy and the standard library are imported here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Literal, overload

import numpy as np
import tvm
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

Weights = dict[str, np.ndarray]

# Additive causal-mask value: finite, so a fully masked row could never produce NaN, and
# large enough that exp() of it underflows to exactly 0 after the softmax max-shift.
MASK_VALUE = float(np.finfo(np.float32).min)


class _Attention(nn.Module):
    """Multi-head self-attention: softmax(q·kᵀ/√d + mask)·v, then an output projection."""

    def __init__(self, hidden: int, heads: int, bias: bool):
        if hidden % heads:
            raise ValueError(f"hidden={hidden} is not divisible by heads={heads}")
        self.heads = heads
        self.head_dim = hidden // heads
        self.q_proj = nn.Linear(hidden, hidden, bias=bias)
        self.k_proj = nn.Linear(hidden, hidden, bias=bias)
        self.v_proj = nn.Linear(hidden, hidden, bias=bias)
        self.o_proj = nn.Linear(hidden, hidden, bias=bias)

    def _split_heads(self, t: nn.Tensor) -> nn.Tensor:
        batch, seq, _ = t.shape
        t = op.reshape(t, (batch, seq, self.heads, self.head_dim))
        return op.permute_dims(t, (0, 2, 1, 3))  # [batch, heads, seq, head_dim]

    def forward(self, x: nn.Tensor, mask: nn.Tensor | None) -> nn.Tensor:
        batch, seq, hidden = x.shape
        q = self._split_heads(self.q_proj(x))
        k = self._split_heads(self.k_proj(x))
        v = self._split_heads(self.v_proj(x))
        scores = op.matmul(q, op.permute_dims(k, (0, 1, 3, 2))) * (1.0 / math.sqrt(self.head_dim))
        if mask is not None:
            scores = scores + mask
        probs = op.softmax(scores, axis=-1)
        context = op.permute_dims(op.matmul(probs, v), (0, 2, 1, 3))
        return self.o_proj(op.reshape(context, (batch, seq, hidden)))


class _EncoderLayer(nn.Module):
    """BERT post-norm layer: LN(x + Attn(x)), then LN(h + W2·gelu(W1·h))."""

    def __init__(self, hidden: int, heads: int, ffn: int):
        self.attn = _Attention(hidden, heads, bias=True)
        self.attn_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: nn.Tensor, mask: nn.Tensor | None = None) -> nn.Tensor:
        h = self.attn_norm(x + self.attn(x, mask))
        return self.ffn_norm(h + self.fc2(op.gelu(self.fc1(h))))


class _DecoderBlock(nn.Module):
    """LLaMA pre-norm block: h = x + Attn(RMS(x)), out = h + down(silu(gate(RMS(h)))·up(RMS(h)))."""

    def __init__(self, hidden: int, heads: int, ffn: int, seq: int):
        self.attn_norm = nn.RMSNorm(hidden, axes=-1, epsilon=1e-5, bias=False)
        self.attn = _Attention(hidden, heads, bias=False)
        self.ffn_norm = nn.RMSNorm(hidden, axes=-1, epsilon=1e-5, bias=False)
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)
        self.seq = seq

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        mask = nn.Tensor.from_const(causal_mask(self.seq))
        h = x + self.attn(self.attn_norm(x), mask)
        normed = self.ffn_norm(h)
        return h + self.down_proj(op.silu(self.gate_proj(normed)) * self.up_proj(normed))


def causal_mask(seq: int) -> np.ndarray:
    """Additive mask ``[1, 1, seq, seq]``: 0 where key ≤ query, ``MASK_VALUE`` above."""
    upper = np.triu(np.ones((seq, seq), dtype=bool), k=1)
    return np.where(upper, MASK_VALUE, 0.0).astype(np.float32)[None, None]


def _init_weights(module: nn.Module, seed: int) -> Weights:
    rng = np.random.default_rng(seed)
    weights = {}
    for name, param in module.named_parameters():
        draw = rng.standard_normal(tuple(int(d) for d in param.shape)) * 0.02
        is_norm_scale = name.endswith("norm.weight")
        weights[name] = (draw + 1.0 if is_norm_scale else draw).astype(np.float32)
    return weights


def _export(
    module: nn.Module, inputs: dict[str, tuple[int, ...]], weights: Weights
) -> tvm.IRModule:
    """Trace ``module.forward`` and bind its parameters, leaving ``main(*inputs)``."""
    spec = {name: nn.spec.Tensor(shape, "float32") for name, shape in inputs.items()}
    traced, params = module.export_tvm({"forward": spec})
    func = traced["forward"]
    bindings = {
        var: weights[name]
        for var, (name, _) in zip(func.params[len(inputs) :], params, strict=True)
    }
    func = func.bind_params(bindings).without_attr("num_input").with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func})


@overload
def encoder_layer(
    seq: int = ...,
    hidden: int = ...,
    heads: int = ...,
    ffn: int = ...,
    batch: int = ...,
    seed: int = ...,
    *,
    attention_mask: bool = ...,
    return_params: Literal[False] = ...,
) -> tvm.IRModule: ...
@overload
def encoder_layer(
    seq: int = ...,
    hidden: int = ...,
    heads: int = ...,
    ffn: int = ...,
    batch: int = ...,
    seed: int = ...,
    *,
    attention_mask: bool = ...,
    return_params: Literal[True],
) -> tuple[tvm.IRModule, Weights]: ...
def encoder_layer(
    seq: int = 128,
    hidden: int = 768,
    heads: int = 12,
    ffn: int = 3072,
    batch: int = 1,
    seed: int = 0,
    *,
    attention_mask: bool = False,
    return_params: bool = False,
) -> tvm.IRModule | tuple[tvm.IRModule, Weights]:
    """BERT-base-style encoder layer (post-LayerNorm, erf GELU, eps 1e-12).

    With ``attention_mask=True`` ``main`` takes a second input ``mask: [batch, 1, seq, seq]``
    that is added to the attention scores before the softmax.
    """
    module = _EncoderLayer(hidden, heads, ffn)
    weights = _init_weights(module, seed)
    inputs = {"x": (batch, seq, hidden)}
    if attention_mask:
        inputs["mask"] = (batch, 1, seq, seq)
    mod = _export(module, inputs, weights)
    return (mod, weights) if return_params else mod


@overload
def decoder_block(
    seq: int = ...,
    hidden: int = ...,
    heads: int = ...,
    ffn: int = ...,
    batch: int = ...,
    seed: int = ...,
    *,
    return_params: Literal[False] = ...,
) -> tvm.IRModule: ...
@overload
def decoder_block(
    seq: int = ...,
    hidden: int = ...,
    heads: int = ...,
    ffn: int = ...,
    batch: int = ...,
    seed: int = ...,
    *,
    return_params: Literal[True],
) -> tuple[tvm.IRModule, Weights]: ...
def decoder_block(
    seq: int = 128,
    hidden: int = 512,
    heads: int = 8,
    ffn: int = 1376,
    batch: int = 1,
    seed: int = 0,
    *,
    return_params: bool = False,
) -> tvm.IRModule | tuple[tvm.IRModule, Weights]:
    """LLaMA-style decoder block (RMSNorm eps 1e-5, causal attention, SiLU-gated MLP, no biases).

    The causal mask is a bound ``[1, 1, seq, seq]`` constant (see ``causal_mask``); there
    is no rotary embedding.
    """
    module = _DecoderBlock(hidden, heads, ffn, seq)
    weights = _init_weights(module, seed)
    mod = _export(module, {"x": (batch, seq, hidden)}, weights)
    return (mod, weights) if return_params else mod


MODEL_BUILDERS: dict[str, Callable[..., tvm.IRModule]] = {
    "encoder_layer": encoder_layer,
    "decoder_block": decoder_block,
}

# Small sizes that build and run in about a second each on 2 cores: for tests.
SMALL_SIZES: dict[str, dict[str, int]] = {
    "encoder_layer": {"seq": 16, "hidden": 64, "heads": 4, "ffn": 128},
    "decoder_block": {"seq": 16, "hidden": 64, "heads": 4, "ffn": 96},
}


def resolve_model(name: str) -> tuple[Callable[..., tvm.IRModule], dict[str, int]]:
    """The builder and size overrides behind a ``BUILTIN_MODELS`` name."""
    family = name.removesuffix("_small")
    if family not in MODEL_BUILDERS:
        raise KeyError(f"unknown built-in model {name!r}; known: {sorted(BUILTIN_MODELS)}")
    return MODEL_BUILDERS[family], (SMALL_SIZES[family] if name.endswith("_small") else {})


BUILTIN_MODELS: dict[str, Callable[[], tvm.IRModule]] = {
    name: functools.partial(builder, **sizes)
    for family, builder in MODEL_BUILDERS.items()
    for name, sizes in ((family, {}), (f"{family}_small", SMALL_SIZES[family]))
}
