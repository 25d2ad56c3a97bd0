"""fused_attention: softmax(q·kᵀ·scale + mask)·v in one kernel.

kᵀ may come through permute_dims; the scale is an optional multiply or divide; the
mask an optional add. Requires the softmax over the last axis and operands whose
contraction dims agree.
"""

from __future__ import annotations

from itertools import product

from tvm.relax import dpl

from ..lattice import ShapeFact
from .candidate import Candidate, Match, Variant, commutative, op, port_requirement


def attention_variants() -> list[Variant]:
    out = []
    for transposed, scale, mask in product((True, False), ("multiply", "divide", None), (True, False)):
        r: dict = {"q": dpl.wildcard(), "k": dpl.wildcard(), "v": dpl.wildcard()}
        k = r["k"]
        if transposed:
            k = r["transpose_k"] = op("relax.permute_dims")(r["k"])
        s = r["scores"] = op("relax.matmul")(r["q"], k)
        if scale == "multiply":
            r["scale"] = dpl.wildcard()
            s = r["scale_op"] = commutative("relax.multiply", s, r["scale"])
        elif scale == "divide":
            r["scale"] = dpl.wildcard()
            s = r["scale_op"] = op("relax.divide")(s, r["scale"])
        if mask:
            r["mask"] = dpl.wildcard()
            s = r["mask_add"] = commutative("relax.add", s, r["mask"])
        r["softmax"] = op("relax.nn.softmax")(s)
        r["context"] = op("relax.matmul")(r["softmax"], r["v"])
        out.append((r["context"], r))
    out.sort(key=lambda v: -len(v[1]))
    return out


def attention_check(m: Match) -> str | None:
    scores = m.shapes.get("scores", ShapeFact.top())
    axis = m.attr("softmax", "axis")
    nd = scores.ndim
    if axis is None or not nd or int(axis) % nd != nd - 1:  # rank 0: no last axis
        return f"shape: softmax axis {axis} is not the last axis of the scores"
    if m.has("scale"):
        s = m.shapes.get("scale", ShapeFact.top())
        if s.dims is None or any(d != 1 for d in s.dims):
            return "shape: scale is not a scalar"
    return None


def attention_requires(m: Match):
    req = {}
    scores = m.shapes.get("scores", ShapeFact.top())
    if m.has("mask") and scores.dims is not None:
        mask = m.shapes.get("mask", ShapeFact.top())
        if mask.ndim is not None and mask.ndim == scores.ndim and mask.dims is not None:
            # the mask may broadcast over batch and heads, never over the score matrix
            req["mask"] = ShapeFact.shape(tuple(mask.dims[:-2]) + tuple(scores.dims[-2:]))
    return port_requirement(**req)


ATTENTION = Candidate("fused_attention", attention_variants, attention_requires, attention_check, priority=60)
