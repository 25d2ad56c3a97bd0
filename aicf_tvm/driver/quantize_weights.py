"""Weight-only quantization of a causal LM's linear layers: ``compile_causal_lm(weights="int8")``.

An explicit opt-in that changes results (the model computes with rounded weights), so it
is never applied by default, and what it changed is recorded: each quantized layer and the
relative error of its output against the float32 layer on the calibration prompt
(``QuantizedLayer``), listed in the report as ``approximate:weights_int8`` decisions.

``int8``: symmetric per output channel, ``scale = max|w| / 127``, ``q = round(w / scale)``
(round half to even) in ``[-127, 127]``. The layer computes
``linear(x, float(q)) * scale + bias``: the cast joins the GEMM kernel
(``aicf_tvm.library.gemm``'s dequantized B, ``schedules.cpu.gemm_analysis.inline_dequantized_operand``),
which reads the int8 weight (prepacked as int8) and converts in registers; the scale is
the GEMM's epilogue. The weight is stored as int8 (``relax_passes.narrow_constants``):
a quarter of the float32 bytes a decode step reads.

The embedding table stays float32 (a step reads one row of it); the LM head is quantized
like the other layers (tied weights get their own int8 copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aicf_tvm.core.errors import UnsupportedModelError
from aicf_tvm.core.report import Decision

if TYPE_CHECKING:
    import torch

WEIGHT_FORMATS = ("float32", "int8")
INT8_MAX = 127


@dataclass(frozen=True)
class QuantizedLayer:
    """One linear layer whose weight was quantized, and what that cost on the calibration prompt."""

    name: str
    weights: str  # "int8"
    shape: tuple[int, int]  # [out, in]
    relative_error: float  # ||y_q - y|| / ||y|| of the layer's output on the calibration prompt

    def decision(self) -> Decision:
        return Decision(f"approximate:weights_{self.weights}", (self.name,), True,
                        note=f"[{self.shape[0]}x{self.shape[1]}] weight per-channel symmetric {self.weights}: "
                             f"relative error {self.relative_error:.2e} of its output on the calibration prompt")


def check_weights(weights: str) -> str:
    """``weights`` if it is a format ``compile_causal_lm`` knows ("fp32" is "float32")."""
    name = {"fp32": "float32"}.get(weights, weights)
    if name not in WEIGHT_FORMATS:
        raise ValueError(f"weights={weights!r}: expected one of {', '.join(WEIGHT_FORMATS)} (or 'fp32')")
    return name


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 ``q`` [out, in], float32 ``scale`` [out]) with ``weight ~ q * scale[:, None]``."""
    import torch

    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def _linear_class() -> type:
    import torch

    class Int8Linear(torch.nn.Module):
        """``linear(x, float(q)) * scale + bias``: the float layer with its weight rounded to int8."""

        def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
            super().__init__()
            q, scale = quantize_int8(weight)
            self.register_buffer("qweight", q)
            self.register_buffer("scale", scale)
            self.bias = None if bias is None else torch.nn.Parameter(bias.detach().float(), requires_grad=False)
            self.out_features, self.in_features = q.shape

        @property
        def weight(self) -> torch.Tensor:  # transformers asks the LM head for its shape
            return self.qweight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.nn.functional.linear(x, self.qweight.to(x.dtype)) * self.scale
            return y if self.bias is None else y + self.bias

    return Int8Linear


def _float_linears(model: torch.nn.Module) -> dict[str, tuple[torch.nn.Module, str, torch.Tensor, Any]]:
    """name -> (parent, attribute, weight [out, in], bias) of every linear layer: ``nn.Linear``
    and transformers' ``Conv1D`` (GPT-2's, its weight stored [in, out])."""
    import torch

    found = {}
    for parent_name, parent in model.named_modules():
        for attr, child in parent.named_children():
            name = f"{parent_name}.{attr}" if parent_name else attr
            if isinstance(child, torch.nn.Linear):
                found[name] = (parent, attr, child.weight, child.bias)
            elif type(child).__name__ == "Conv1D" and getattr(child, "weight", None) is not None \
                    and child.weight.ndim == 2:
                found[name] = (parent, attr, child.weight.t(), child.bias)
    return found


def quantize_linears(model: torch.nn.Module, weights: str, calibration: torch.Tensor) -> list[QuantizedLayer]:
    """Replace every linear layer of ``model`` (in place) by its ``weights`` form; each
    layer's output error is measured on the inputs it sees for ``calibration`` (token ids)."""
    import torch

    layers = _float_linears(model)
    if not layers:
        raise UnsupportedModelError(f"{type(model).__name__}: no linear layers to quantize")
    inputs: dict[str, torch.Tensor] = {}
    hooks = [getattr(p, a).register_forward_pre_hook(lambda _m, args, n=n: inputs.setdefault(n, args[0].detach()))
             for n, (p, a, _w, _b) in layers.items()]
    try:
        with torch.no_grad():
            model(input_ids=calibration)
    finally:
        for hook in hooks:
            hook.remove()
    cls, out = _linear_class(), []
    for name, (parent, attr, weight, bias) in layers.items():
        float_layer = getattr(parent, attr)
        quantized = cls(weight, bias)
        x = inputs.get(name)
        error = float("nan")
        if x is not None:
            with torch.no_grad():
                want, got = float_layer(x), quantized(x)
            error = float(torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want).clamp(min=1e-30))
        setattr(parent, attr, quantized)
        out.append(QuantizedLayer(name, weights, (int(weight.shape[0]), int(weight.shape[1])), error))
    return out


__all__ = ["WEIGHT_FORMATS", "QuantizedLayer", "check_weights", "quantize_int8", "quantize_linears"]
