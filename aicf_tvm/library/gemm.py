"""fused_gemm_bias_act and fused_conv2d_bias_act: a GEMM or convolution with its epilogue.

matmul (B optionally through permute_dims) or conv2d, then an optional bias add, an
optional activation (relu, gelu, gelu_tanh, silu), an optional residual add and, for
convolutions, an optional relu after the residual (ResNet's add-relu).

A convolution in a blocked layout (``NCHW{b}c``, chosen by ``MaterializeEmits``) requires
its data in that layout (a layout fact, ⊤ for plain NCHW data) and its bias per channel
in it: ``[1, C/b, 1, 1, b]``.
"""

from __future__ import annotations

from itertools import product

from tvm.relax import dpl

from aicf_tvm.core.candidate import (
    Candidate,
    Match,
    Variant,
    commutative,
    last_dim,
    op,
    port_requirement,
)
from aicf_tvm.core.kinds.layouts import block_of
from aicf_tvm.core.lattice import ShapeFact

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")


def _epilogue_variants(core: dpl.DFPattern, roles: dict, post_relu: bool) -> list[Variant]:
    out = []
    for has_bias, act, has_res in product((True, False), (*ACTIVATIONS, None), (True, False)):
        r = dict(roles)
        t = core
        if has_bias:
            r["bias"] = dpl.wildcard()
            t = r["bias_add"] = commutative("relax.add", t, r["bias"])
        if act:
            t = r["act"] = op(f"relax.nn.{act}")(t)
        if has_res:
            r["residual"] = dpl.wildcard()
            t = r["residual_add"] = commutative("relax.add", t, r["residual"])
        variants = [(t, r)]
        if post_relu and has_res:
            r2 = dict(r)
            r2["post_act"] = op("relax.nn.relu")(t)
            variants.insert(0, (r2["post_act"], r2))
        out.extend(variants)
    out.sort(key=lambda v: -len(v[1]))  # most specific first
    return out


def gemm_variants() -> list[Variant]:
    out = []
    for transposed, dequantized in product((True, False), (True, False)):
        a, w = dpl.wildcard(), dpl.is_const() if dequantized else dpl.wildcard()
        roles = {"a": a, "b": w}
        b = w
        if dequantized:  # a narrow (int8) weight read as float: the cast joins the kernel
            b = roles["dequant_b"] = op("relax.astype")(w)
        if transposed:
            b = roles["transpose_b"] = op("relax.permute_dims")(b)
        roles["matmul"] = op("relax.matmul")(a, b)
        out.extend(_epilogue_variants(roles["matmul"], roles, post_relu=False))
    out.sort(key=lambda v: -len(v[1]))
    return out


def conv_variants() -> list[Variant]:
    data, w = dpl.wildcard(), dpl.wildcard()
    roles = {"data": data, "weight": w}
    roles["conv"] = op("relax.nn.conv2d")(data, w)
    return _epilogue_variants(roles["conv"], roles, post_relu=True)


def _bias_and_residual(m: Match, out_role: str, channel_axis: int, blocked: bool = False) -> dict[str, ShapeFact]:
    out = m.shapes.get(out_role, ShapeFact.top())
    req: dict[str, ShapeFact] = {}
    if m.has("bias") and out.dims is not None:
        bias = m.shapes.get("bias", ShapeFact.top())
        rank = bias.ndim if bias.ndim is not None else 1
        n = out.dims[channel_axis]
        if blocked:  # [1, C/b, 1, 1, b]
            dims = (1, n, 1, 1, out.dims[-1])
        elif channel_axis == -1:
            dims = (1,) * (rank - 1) + (n,)
        else:  # per-channel bias of NCHW: [C, 1, 1] or [1, C, 1, 1]; a [C] one would
            # broadcast along W, so a scalar bias is broadcast to [C, 1, 1], not to [C]
            dims = (1,) * max(rank - 3, 0) + (n, 1, 1)
        req["bias"] = ShapeFact.shape(dims)
    if m.has("residual") and out.dims is not None:
        req["residual"] = ShapeFact.shape(out.dims)
    return req


def gemm_requires(m: Match):
    req = _bias_and_residual(m, "matmul", -1)
    b = m.shapes.get("b", ShapeFact.top())
    if b.ndim is not None and b.ndim >= 2:
        req.setdefault("b", ShapeFact.rank(b.ndim))
    return port_requirement(**req)


def gemm_check(m: Match) -> str | None:
    out = m.shapes.get("matmul", ShapeFact.top())
    if m.has("bias") and last_dim(out) is None:
        return "shape: output columns unknown, bias layout unproven"
    return None


def conv_requires(m: Match):
    data_layout = str(m.attr("conv", "data_layout", "NCHW"))
    blocked = block_of(str(m.attr("conv", "out_layout", "NCHW"))) is not None
    req = _bias_and_residual(m, "conv", 1, blocked)
    if block_of(data_layout) is not None:
        req["data"] = ShapeFact.top().with_layout(data_layout)
    return port_requirement(**req)


def conv_check(m: Match) -> str | None:
    layout, out = str(m.attr("conv", "data_layout", "NCHW")), str(m.attr("conv", "out_layout", "NCHW"))
    if (layout, out) != ("NCHW", "NCHW") and block_of(out) is None:
        return f"layout: data_layout {layout}, out_layout {out} is neither NCHW nor blocked NCHW{{b}}c"
    if layout != "NCHW" and block_of(layout) is None:
        return f"layout: data_layout {layout} is neither NCHW nor blocked NCHW{{b}}c"
    return None


def gemm_candidate(accumulation: str | None = None, label: str = "", priority: int = 50) -> Candidate:
    return Candidate("fused_gemm_bias_act", gemm_variants, gemm_requires, gemm_check,
                     accumulation=accumulation, label=label, priority=priority)


GEMM = gemm_candidate()
CONV = Candidate("fused_conv2d_bias_act", conv_variants, conv_requires, conv_check, priority=50)
