"""ONNX twins of the built-in models, for comparing TVM builds against ONNX Runtime.

``to_onnx(name)`` writes the same math with the same weights as
``aicf_tvm.driver.models.BUILTIN_MODELS[name]`` as an opset-17 ONNX graph (input ``x``, output
``y``). The graph is built node by node with ``onnx.helper`` rather than through
``torch.onnx.export``: torch 2.13's default exporter needs ``onnxscript`` and the
TorchScript one is deprecated. GELU and RMSNorm are spelled out (Erf; ReduceMean/Sqrt)
because their fused ONNX ops need opset 20/23. ``onnx`` is imported lazily.
"""

from __future__ import annotations

import inspect
import math
from types import ModuleType
from typing import Any

import numpy as np

from aicf_tvm.driver.models import Weights, causal_mask, encoder_layer, resolve_model

OPSET = 17


class _Graph:
    """Accumulates nodes and initializers; every helper returns its output's name."""

    def __init__(self, helper: ModuleType, numpy_helper: ModuleType) -> None:
        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []

    def const(self, name: str, value: np.ndarray | float | list[int]) -> str:
        array = np.asarray(value, dtype=np.int64 if isinstance(value, list) else np.float32)
        self.initializers.append(self.numpy_helper.from_array(array, name))
        return name

    def node(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        out = f"{op_type.lower()}_{len(self.nodes)}"
        self.nodes.append(self.helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def linear(self, x: str, weights: Weights, prefix: str) -> str:
        w = self.const(f"{prefix}.weight.T", weights[f"{prefix}.weight"].T)
        y = self.node("MatMul", x, w)
        if f"{prefix}.bias" in weights:
            y = self.node("Add", y, self.const(f"{prefix}.bias", weights[f"{prefix}.bias"]))
        return y

    def attention(
        self, x: str, weights: Weights, shape: tuple[int, int, int], heads: int, mask: str | None
    ) -> str:
        batch, seq, hidden = shape
        head_dim = hidden // heads
        split = self.const("split_heads_shape", [batch, seq, heads, head_dim])

        def heads_of(proj: str, perm: list[int]) -> str:
            t = self.node("Reshape", self.linear(x, weights, f"attn.{proj}"), split)
            return self.node("Transpose", t, perm=perm)

        q = heads_of("q_proj", [0, 2, 1, 3])
        k_t = heads_of("k_proj", [0, 2, 3, 1])
        v = heads_of("v_proj", [0, 2, 1, 3])
        scale = self.const("attn_scale", 1.0 / math.sqrt(head_dim))
        scores = self.node("Mul", self.node("MatMul", q, k_t), scale)
        if mask is not None:
            scores = self.node("Add", scores, mask)
        context = self.node("MatMul", self.node("Softmax", scores, axis=-1), v)
        context = self.node("Transpose", context, perm=[0, 2, 1, 3])
        merged = self.node(
            "Reshape", context, self.const("merge_heads_shape", [batch, seq, hidden])
        )
        return self.linear(merged, weights, "attn.o_proj")

    def layer_norm(self, x: str, weights: Weights, prefix: str, eps: float) -> str:
        scale = self.const(f"{prefix}.weight", weights[f"{prefix}.weight"])
        bias = self.const(f"{prefix}.bias", weights[f"{prefix}.bias"])
        return self.node("LayerNormalization", x, scale, bias, axis=-1, epsilon=eps)

    def rms_norm(self, x: str, weights: Weights, prefix: str, eps: float) -> str:
        mean_sq = self.node("ReduceMean", self.node("Mul", x, x), axes=[-1], keepdims=1)
        rms = self.node("Sqrt", self.node("Add", mean_sq, self.const(f"{prefix}.eps", eps)))
        scale = self.const(f"{prefix}.weight", weights[f"{prefix}.weight"])
        return self.node("Mul", self.node("Div", x, rms), scale)

    def gelu(self, x: str) -> str:
        erf = self.node("Erf", self.node("Div", x, self.const("sqrt2", math.sqrt(2.0))))
        one_plus = self.node("Add", erf, self.const("one", 1.0))
        return self.node("Mul", self.node("Mul", x, one_plus), self.const("half", 0.5))


def _encoder(
    g: _Graph, weights: Weights, shape: tuple[int, int, int], heads: int, mask: str | None
) -> str:
    h = g.node("Add", "x", g.attention("x", weights, shape, heads, mask))
    h = g.layer_norm(h, weights, "attn_norm", eps=1e-12)
    ffn = g.linear(g.gelu(g.linear(h, weights, "fc1")), weights, "fc2")
    return g.layer_norm(g.node("Add", h, ffn), weights, "ffn_norm", eps=1e-12)


def _decoder(g: _Graph, weights: Weights, shape: tuple[int, int, int], heads: int) -> str:
    mask = g.const("causal_mask", causal_mask(shape[1]))
    attn = g.attention(g.rms_norm("x", weights, "attn_norm", 1e-5), weights, shape, heads, mask)
    h = g.node("Add", "x", attn)
    normed = g.rms_norm(h, weights, "ffn_norm", 1e-5)
    gate = g.linear(normed, weights, "gate_proj")
    gated = g.node(
        "Mul", g.node("Mul", gate, g.node("Sigmoid", gate)), g.linear(normed, weights, "up_proj")
    )
    return g.node("Add", h, g.linear(gated, weights, "down_proj"))


def to_onnx(name: str, **overrides: Any) -> bytes:
    """Serialized ONNX model equal to ``BUILTIN_MODELS[name]`` (with builder ``overrides``).

    ``overrides`` are passed to the builder (``seq=…``, ``seed=…``; ``attention_mask=True``
    for the encoder adds an input ``mask: [batch, 1, seq, seq]``). Raises ``KeyError`` for
    a name that is not a built-in model.
    """
    # onnx is an optional dependency: loaded only when a twin is asked for.
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    builder, sizes = resolve_model(name)
    defaults = {p.name: p.default for p in inspect.signature(builder).parameters.values()}
    kwargs = {**defaults, **sizes, **overrides}
    _, weights = builder(**{**kwargs, "return_params": True})
    shape = (kwargs["batch"], kwargs["seq"], kwargs["hidden"])
    g = _Graph(helper, numpy_helper)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
    if builder is encoder_layer:
        mask = "mask" if kwargs.get("attention_mask") else None
        if mask:
            mask_shape = (shape[0], 1, shape[1], shape[1])
            inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, mask_shape))
        out = _encoder(g, weights, shape, kwargs["heads"], mask)
    else:
        out = _decoder(g, weights, shape, kwargs["heads"])
    g.nodes.append(helper.make_node("Identity", [out], ["y"]))
    graph = helper.make_graph(
        g.nodes,
        name,
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        initializer=g.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8  # readable by every onnxruntime that supports opset 17
    onnx.checker.check_model(model)
    return model.SerializeToString()
