"""PyTorch twins of the built-in encoder layer, built from its weights (``encoder_layer(...,
return_params=True)``; Linear weights are ``[out, in]`` as in PyTorch), for the GPU
correctness tests and ``scripts/gpu_bench.py``.  Written from the layer's formulas
(post-norm BERT: LN(x + Attn(x)), LN(h + W2·gelu(W1·h)), erf GELU, eps 1e-12)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np


def torch_encoder_layer(weights: dict[str, np.ndarray], heads: int, device: str = "cuda") -> Callable:
    """A function ``x -> out`` on ``device`` computing the encoder layer in float32 eager mode."""
    import torch
    import torch.nn.functional as F

    w = {name: torch.from_numpy(value).to(device) for name, value in weights.items()}

    def linear(x, prefix):
        return F.linear(x, w[f"{prefix}.weight"], w.get(f"{prefix}.bias"))

    def attention(x):
        batch, seq, hidden = x.shape
        d = hidden // heads

        def split(t):
            return t.reshape(batch, seq, heads, d).transpose(1, 2)

        q, k, v = (split(linear(x, f"attn.{p}_proj")) for p in "qkv")
        probs = torch.softmax(q @ k.transpose(-1, -2) * (1.0 / math.sqrt(d)), dim=-1)
        return linear((probs @ v).transpose(1, 2).reshape(batch, seq, hidden), "attn.o_proj")

    def norm(x, prefix):
        return F.layer_norm(x, x.shape[-1:], w[f"{prefix}.weight"], w[f"{prefix}.bias"], eps=1e-12)

    @torch.no_grad()
    def forward(x):
        h = norm(x + attention(x), "attn_norm")
        return norm(h + linear(F.gelu(linear(h, "fc1")), "fc2"), "ffn_norm")

    return forward
