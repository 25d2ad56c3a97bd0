"""Weight-only quantization of a causal LM's linear layers: ``compile_causal_lm(weights="int8" | "int4")``.

An explicit opt-in that changes results (the model computes with rounded weights), so it
is never applied by default, and what it changed is recorded: each quantized layer and the
relative error of its output against the float32 layer on the calibration prompt
(``QuantizedLayer``), listed in the report as ``approximate:weights_int8`` /
``approximate:weights_int4`` decisions.

``int8``: symmetric per output channel, ``scale = max|w| / 127``, ``q = round(w / scale)``
(round half to even) in ``[-127, 127]``. The layer computes
``linear(x, float(q)) * scale + bias``: the cast joins the GEMM kernel
(``aicf_tvm.library.gemm``'s dequantized B, ``schedules.cpu.gemm_analysis.inline_dequantized_operand``),
which reads the int8 weight (prepacked as int8) and converts in registers; the scale is
the GEMM's epilogue. The weight is stored as int8 (``relax_passes.narrow_constants``):
a quarter of the float32 bytes a decode step reads.

``int4``: symmetric per group of 32 inputs of an output channel, ``scale = max|w| / 7``
(stored as float16 when every scale of the layer is a normal float16, float32 otherwise),
``v = round(w / scale)`` in ``[-7, 7]`` by the stored scale, as two's complement nibbles,
eight per int32, in the order of ``schedules.cpu.linear_int4``'s kernels (packed at
quantization), with the scales beside them. The layer is one op, ``aicf::linear_int4``
(a PyTorch custom op: ``linear(x, v * scale)`` in PyTorch), which the importer turns into
a call of those kernels (``aicf_tvm.driver.frontends.int4``): the decode step reads the packed
words and widens them in registers. A layer whose outputs are no multiple of the kernels'
block of 64 (GPT-2's 50257-token head) gets zero rows up to one, whose outputs are
dropped after the kernel; one whose inputs are no multiple of 32 is stored as int8
instead, and its decision says so.

``activations="int8"`` (with ``int4`` or ``int8``): each layer's input is also rounded, to
int8 per group of 32 inputs (``quantize_activations``: ``q = round(x / s)``, ``s = max|x| /
127``), and the layer is ``aicf::linear_int4_q8`` (``linear(q * s, v * scale)`` in PyTorch)
or ``aicf::linear_int8_q8`` (``linear(q * s, q_w * scale)``; the int8 weight then packed
4 to an int32 word, ``schedules.cpu.linear_int4.pack_int8``), whose kernels sum the
weights and the int8 inputs in integers (``schedules.cpu.linear_int4.gemv_int4_q8``,
``linear_int4_q8``). A layer whose inputs are no multiple of 32 keeps float32 inputs, and
its decision says so. The layers' errors and decisions (``approximate:activations_int8``)
include the activations' rounding. ``activations="auto"`` (the default) is ``"int8"`` with
quantized weights where the target runs those kernels (``resolve_activations``), as every
CPU LLM engine computes at 4 and 8 bits (llama.cpp's q8_0 / q4_0 dot products, ONNX Runtime
GenAI's int4 accuracy level 4, OpenVINO's dynamic quantization), and ``"float32"`` elsewhere.

The embedding table stays float32 (a step reads one row of it); the LM head is quantized
like the other layers (tied weights get their own int8 copy).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aicf_tvm.core.errors import UnsupportedModelError
from aicf_tvm.core.report import Decision
from aicf_tvm.runtime.targets import describe
from schedules.cpu.linear_int4 import BLOCK, GROUP, NIBBLES, has_q8, pack_int4, pack_int8, scale_dtype

if TYPE_CHECKING:
    import torch
    from tvm.target import Target

WEIGHT_FORMATS = ("float32", "int8", "int4")
ACTIVATION_FORMATS = ("auto", "float32", "int8")
INT8_MAX = 127
INT4_MAX = 7


@dataclass(frozen=True)
class QuantizedLayer:
    """One linear layer whose weight was quantized, and what that cost on the calibration prompt."""

    name: str
    weights: str  # "int8" or "int4"
    shape: tuple[int, int]  # [out, in]
    relative_error: float  # ||y_q - y|| / ||y|| of the layer's output on the calibration prompt
    note: str = ""  # why it is not in the format asked for
    activations: str = "float32"  # "int8": its input rounded to int8 per group too

    def decision(self) -> Decision:
        form = "per-channel symmetric int8" if self.weights == "int8" else f"symmetric int4 in groups of {GROUP}"
        kind = f"weights_{self.weights}"
        if self.activations == "int8":
            kind, form = "activations_int8", f"{form}, input rounded to int8 in groups of {GROUP}"
        return Decision(f"approximate:{kind}", (self.name,), True,
                        note=f"[{self.shape[0]}x{self.shape[1]}] weight {form}{self.note}: relative error "
                             f"{self.relative_error:.2e} of its output on the calibration prompt")


def check_weights(weights: str) -> str:
    """``weights`` if it is a format ``compile_causal_lm`` knows ("fp32" is "float32")."""
    name = {"fp32": "float32"}.get(weights, weights)
    if name not in WEIGHT_FORMATS:
        raise ValueError(f"weights={weights!r}: expected one of {', '.join(WEIGHT_FORMATS)} (or 'fp32')")
    return name


def check_activations(activations: str, weights: str) -> str:
    """``activations`` if ``compile_causal_lm`` can round the layers' inputs so with ``weights``."""
    name = {"fp32": "float32"}.get(activations, activations)
    if name not in ACTIVATION_FORMATS:
        raise ValueError(f"activations={activations!r}: expected one of {', '.join(ACTIVATION_FORMATS)}")
    if name == "int8" and weights not in ("int4", "int8"):
        raise ValueError(f"activations='int8' goes with weights='int4' or 'int8' (their integer kernels), "
                         f"not weights={weights!r}")
    return name


def resolve_activations(activations: str, weights: str, target: Target) -> str:
    """The activations ``compile_causal_lm`` computes with: ``"auto"`` is ``"int8"`` with
    quantized weights where ``target`` has their integer kernels (``has_q8``: AVX2 for int4,
    AVX-512 VNNI for int8), else ``"float32"``; ``"int8"`` where it has none is refused."""
    name = check_activations(activations, weights)
    bits = 8 if weights == "int8" else 4
    if name == "auto":
        return "int8" if weights in ("int4", "int8") and has_q8(target, bits) else "float32"
    if name == "int8" and not has_q8(target, bits):
        need = ("AVX-512 VNNI (its int8 kernels sum bytes with vpdpbusd; AVX2's vpmaddubsw would saturate on "
                "int8 weights: weights='int4' runs on AVX2)" if weights == "int8"
                else "AVX2 (its kernel sums bytes with vpmaddubsw)")
        raise ValueError(f"activations='int8' with weights={weights!r} needs an x86 CPU with {need}; "
                         f"the target {describe(target)} has none")
    return name


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """``x [..., K]`` rounded to int8 per group of ``GROUP`` inputs and back: ``q * s`` with
    ``s = max|x| / 127`` over the group (1 for a group of zeros), ``q = round(x / s)`` (half
    to even) in [-127, 127]."""
    import torch

    groups = x.reshape(*x.shape[:-1], x.shape[-1] // GROUP, GROUP)
    amax = groups.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
    return (torch.round(groups / scale).clamp(-INT8_MAX, INT8_MAX) * scale).reshape(x.shape)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 ``q`` [out, in], float32 ``scale`` [out]) with ``weight ~ q * scale[:, None]``."""
    import torch

    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def quantize_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 ``v`` [out, in] in [-7, 7], ``scale`` [out, in / GROUP]) with ``weight ~ v *
    scale`` repeated along each group; the scales float16 where every one is a normal
    float16 (``scale_dtype``), float32 otherwise, and ``v`` rounded by the stored scales."""
    import torch

    w = weight.detach().float()
    groups = w.reshape(w.shape[0], -1, GROUP)
    amax = groups.abs().amax(dim=2)
    scale = torch.where(amax > 0, amax / INT4_MAX, torch.ones_like(amax))
    scale = scale.to(getattr(torch, scale_dtype(scale.numpy())))
    v = torch.round(groups / scale.float()[:, :, None]).clamp(-INT4_MAX, INT4_MAX).to(torch.int8)
    return v.reshape(w.shape), scale


def unpack_int4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The float32 weight ``[N, K]`` of ``linear_int4``'s operands (``pack_int4``'s layout)."""
    import torch

    tasks, words, block = packed.shape
    shifts = torch.tensor([28 - 4 * i for i in range(NIBBLES)], dtype=torch.int32)
    v = (packed[:, :, None, :] << shifts[None, None, :, None]) >> 28  # [N/B, K/8, 8, B], sign-extended
    v = v.reshape(tasks, words * NIBBLES, block)
    scale = scales.float().repeat_interleave(GROUP, dim=1)  # [N/B, K, B]
    return (v.to(torch.float32) * scale).permute(0, 2, 1).reshape(tasks * block, words * NIBBLES)


def unpack_int8(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The float32 weight ``[N, K]`` of the int8 q8 kernels' operands (``pack_int8``'s layout)."""
    import torch

    tasks, words, block = packed.shape
    q = packed.permute(0, 2, 1).contiguous().view(torch.int8).reshape(tasks * block, words * 4)
    return q.to(torch.float32) * scales.reshape(tasks * block, 1).float()


_PACKED_OPS: dict[str, Any] = {}  # op name -> the registered op


def _packed_linear_op(name: str, unpack: Any, rounded: bool) -> Any:
    """``aicf::<name>(x, packed, scales)``: ``linear(x, unpack(packed, scales))``, ``x``
    first rounded by ``quantize_activations`` when ``rounded``. Registered with PyTorch
    once; ``torch.export`` keeps it as one node."""
    if name not in _PACKED_OPS:
        import torch

        @torch.library.custom_op(f"aicf::{name}", mutates_args=(),
                                 schema="(Tensor x, Tensor packed, Tensor scales) -> Tensor")
        def op(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.linear(quantize_activations(x) if rounded else x, unpack(packed, scales))

        @op.register_fake
        def _(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
            return x.new_empty((*x.shape[:-1], packed.shape[0] * packed.shape[2]))

        _PACKED_OPS[name] = getattr(torch.ops.aicf, name).default
    return _PACKED_OPS[name]


def linear_int4_op(activations: str = "float32") -> Any:
    """``aicf::linear_int4(x, packed, scales)``: ``linear(x, unpack_int4(packed, scales))``;
    with ``activations="int8"`` ``aicf::linear_int4_q8``: ``linear(quantize_activations(x),
    ...)``."""
    rounded = activations == "int8"
    return _packed_linear_op("linear_int4_q8" if rounded else "linear_int4", unpack_int4, rounded)


def linear_int8_q8_op() -> Any:
    """``aicf::linear_int8_q8(x, packed, scales)``: ``linear(quantize_activations(x),
    unpack_int8(packed, scales))`` (int8 weights with int8 activations)."""
    return _packed_linear_op("linear_int8_q8", unpack_int8, True)


def _linear_int8_float(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``aicf::linear_int8_q8`` without the inputs' rounding (``inputs_not_rounded``)."""
    import torch

    return torch.nn.functional.linear(x, unpack_int8(packed, scales))


@contextlib.contextmanager
def inputs_not_rounded(model: torch.nn.Module) -> Iterator[None]:
    """``model``'s int4 / int8 layers with float32 inputs while in the block (their int8
    activations' rounding undone): how far rounding moves the model's outputs."""
    pairs = ((linear_int4_op("int8"), linear_int4_op("float32")), (linear_int8_q8_op(), _linear_int8_float))
    rounded = [(m, op, plain) for m in model.modules() for op, plain in pairs if getattr(m, "op", None) is op]
    for m, _op, plain in rounded:
        m.op = plain
    try:
        yield
    finally:
        for m, op, _plain in rounded:
            m.op = op


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

    class PackedLinear(torch.nn.Module):
        """``aicf::linear_int4(x, packed, scales) + bias`` (or ``linear_int4_q8``, or with
        ``bits=8`` ``linear_int8_q8``): the float layer with its weight rounded to
        group-wise int4 or per-channel int8 and packed for the kernels, its outputs padded
        to whole blocks of them (module docstring)."""

        def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, activations: str = "float32",
                     bits: int = 4) -> None:
            super().__init__()
            out = weight.shape[0]
            padded = -(-out // BLOCK) * BLOCK  # outputs of the kernels: zero rows up to whole blocks
            weight = torch.nn.functional.pad(weight.detach().float(), (0, 0, 0, padded - out))
            quantize, pack = (quantize_int4, pack_int4) if bits == 4 else (quantize_int8, pack_int8)
            v, scale = quantize(weight)
            packed, scales = pack(v.numpy(), scale.numpy())
            self.register_buffer("packed", torch.from_numpy(packed))
            self.register_buffer("scales", torch.from_numpy(scales))
            self.bias = None if bias is None else torch.nn.Parameter(bias.detach().float(), requires_grad=False)
            self.out_features, self.in_features = out, v.shape[1]
            self.unpack = unpack_int4 if bits == 4 else unpack_int8
            self.op = linear_int4_op(activations) if bits == 4 else linear_int8_q8_op()

        @property
        def weight(self) -> torch.Tensor:  # transformers asks the LM head for its shape
            return self.unpack(self.packed, self.scales)[:self.out_features]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.op(x, self.packed, self.scales)
            if y.shape[-1] != self.out_features:
                y = y[..., :self.out_features]
            return y if self.bias is None else y + self.bias

    return {"int8": Int8Linear, "packed": PackedLinear}


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


def quantize_linears(model: torch.nn.Module, weights: str, calibration: torch.Tensor,
                     activations: str = "float32") -> list[QuantizedLayer]:
    """Replace every linear layer of ``model`` (in place) by its ``weights`` form (the int4
    ones' inputs rounded to ``activations``); each layer's output error is measured on the
    inputs it sees for ``calibration`` (token ids)."""
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
    classes, out = _linear_class(), []
    for name, (parent, attr, weight, bias) in layers.items():
        float_layer = getattr(parent, attr)
        form, note = weights, ""
        if form == "int4" and weight.shape[1] % GROUP:
            form, note = "int8", f" (int4 groups need inputs a multiple of {GROUP})"
        rounded = activations
        if rounded == "int8" and weight.shape[1] % GROUP:
            rounded = "float32"
            note += f" (int8 activations: inputs not a multiple of {GROUP}, left float32)"
        if form == "int4":
            quantized = classes["packed"](weight, bias, rounded)
        elif rounded == "int8":  # the q8 kernels' 8-bit form
            quantized = classes["packed"](weight, bias, rounded, bits=8)
        else:
            quantized = classes["int8"](weight, bias)
        x = inputs.get(name)
        error = float("nan")
        if x is not None:
            with torch.no_grad():
                want, got = float_layer(x), quantized(x)
            error = float(torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want).clamp(min=1e-30))
        setattr(parent, attr, quantized)
        out.append(QuantizedLayer(name, form, (int(weight.shape[0]), int(weight.shape[1])), error, note, rounded))
    return out


__all__ = ["ACTIVATION_FORMATS", "WEIGHT_FORMATS", "QuantizedLayer", "check_activations", "check_weights",
           "inputs_not_rounded", "linear_int4_op", "linear_int8_q8_op", "quantize_activations", "quantize_int4",
           "quantize_int8", "quantize_linears", "unpack_int4", "unpack_int8"]
