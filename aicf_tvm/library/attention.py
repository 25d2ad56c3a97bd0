"""fused_attention: softmax(q·kᵀ·scale + mask)·v in one kernel.

The pattern follows attention as frontends decompose it (PyTorch's SDPA through
``torch.export``, ONNX graphs):

* q, k and v reach their matmuls through chains of view ops (``views``): the head split
  (reshape + permute_dims), kᵀ (permute_dims), grouped-query ``repeat_kv`` (expand_dims +
  broadcast_to + reshape) and the 4-D/3-D reshapes around a batched matmul. The views
  join the group, so the kernel indexes the original buffers through them: no transpose
  and no repeated k/v is materialized.
* the scale is a multiply on q and/or on kᵀ (SDPA splits √scale onto both), or a
  multiply/divide of the scores; each is computed where the graph has it (no
  reassociation into one multiply).
* an optional mask add (the mask may broadcast over batch and heads);
* an optional "safe softmax" tail: ``where(all(scores == -inf, row), 0, softmax)``, so a
  row with every score masked yields 0, exactly as the graph does;
* the head merge after the second matmul (views again) is part of the group.

Requires the softmax over the last axis of the scores and scalar scales. Every member is
inlined as it is (FuseEmits), so the fused kernel computes exactly the graph's ops.
"""

from __future__ import annotations

from itertools import product

from tvm.relax import dpl

from aicf_tvm.core.candidate import Candidate, Match, Variant, commutative, op, port_requirement
from aicf_tvm.core.lattice import ShapeFact

VIEW_OPS = ("relax.reshape", "relax.permute_dims", "relax.broadcast_to", "relax.expand_dims", "relax.squeeze",
            "relax.strided_slice")
MAX_VIEWS = 9  # longest view chain seen: v sliced from a QKV GEMM, through repeat_kv and the 3-D reshape


def views(x: dpl.DFPattern, depth: int = MAX_VIEWS) -> dpl.DFPattern:
    """``x`` under up to ``depth`` view ops; the matcher takes the longest chain."""
    pat = x
    for _ in range(depth):
        inner = pat
        alts = [op(name)(inner) if name in ("relax.permute_dims", "relax.squeeze", "relax.expand_dims")
                else op(name)(inner, varg_default_wildcard=True) if name == "relax.strided_slice"
                else op(name)(inner, dpl.wildcard()) for name in VIEW_OPS]
        pat = alts[0]
        for alt in alts[1:]:
            pat = pat | alt
        pat = pat | x
    return pat


def _operand(r: dict, name: str, scaled: bool) -> dpl.DFPattern:
    """A q/k/v operand: views, optionally a scale multiply, views."""
    r[name] = dpl.wildcard()
    x = views(r[name])
    if scaled:
        r[f"scale_{name}"] = dpl.wildcard()
        x = r[f"{name}_scale_op"] = commutative("relax.multiply", x, r[f"scale_{name}"])
    return views(x)


def _safe_tail(r: dict, scores: dpl.DFPattern, softmax: dpl.DFPattern) -> dpl.DFPattern:
    """where(not(any(not(scores == c))), z, softmax): SDPA's all-masked-row guard."""
    r["neg_inf"] = dpl.wildcard()
    r["zero"] = dpl.wildcard()
    masked = r["masked"] = op("relax.equal")(scores, r["neg_inf"])
    kept = r["kept"] = op("relax.logical_not")(masked)
    any_kept = r["any_kept"] = op("relax.max")(op("relax.astype")(kept))
    none_kept = r["none_kept"] = op("relax.logical_not")(op("relax.astype")(any_kept))
    return op("relax.where")(none_kept, r["zero"], softmax)


def attention_variants() -> list[Variant]:
    out = []
    for scale_q, scale_k, scale, mask, safe in product(
        (True, False), (True, False), ("multiply", "divide", None), (True, False), (True, False)
    ):
        if scale is not None and (scale_q or scale_k):
            continue
        r: dict = {}
        q = _operand(r, "q", scale_q)
        k = _operand(r, "k", scale_k)
        s = r["scores"] = op("relax.matmul")(q, k)
        s = views(s)
        if scale == "multiply":
            r["scale"] = dpl.wildcard()
            s = r["scale_op"] = commutative("relax.multiply", s, r["scale"])
        elif scale == "divide":
            r["scale"] = dpl.wildcard()
            s = r["scale_op"] = op("relax.divide")(s, r["scale"])
        if mask:
            r["mask"] = dpl.wildcard()
            s = r["mask_add"] = commutative("relax.add", s, r["mask"])
            s = views(s)  # SinkReshapes moves the scores' reshape below a scalar mask
        p = r["softmax"] = op("relax.nn.softmax")(s)
        if safe:
            p = r["safe"] = _safe_tail(r, s, p)
        r["context"] = op("relax.matmul")(views(p), _operand(r, "v", False))
        out.append((views(r["context"]), r))
    out.sort(key=lambda v: -len(v[1]))
    return out


def _is_scalar(m: Match, role: str) -> bool:
    s = m.shapes.get(role, ShapeFact.top())
    return s.dims is not None and all(d == 1 for d in s.dims)


def attention_check(m: Match) -> str | None:
    scores = m.shapes.get("softmax", ShapeFact.top())
    axis = m.attr("softmax", "axis")
    nd = scores.ndim
    if axis is None or not nd or int(axis) % nd != nd - 1:  # rank 0: no last axis
        return f"shape: softmax axis {axis} is not the last axis of the scores"
    for role in ("scale", "scale_q", "scale_k"):
        if m.has(role) and not _is_scalar(m, role):
            return f"shape: {role} is not a scalar"
    if m.has("safe"):
        any_axis = m.attr("any_kept", "axis")
        if any_axis is None or len(any_axis) != 1 or int(any_axis[0]) % nd != nd - 1:
            return "shape: the all-masked-row guard does not reduce the softmax axis"
    return None


def attention_requires(m: Match):
    req = {}
    scores = m.shapes.get("softmax", ShapeFact.top())
    if m.has("mask") and scores.dims is not None:
        mask = m.shapes.get("mask", ShapeFact.top())
        if mask.ndim is not None and mask.ndim == scores.ndim and mask.dims is not None:
            # the mask may broadcast over batch and heads, and over the query rows (one mask
            # row for every query: a padding mask, or the grouped query heads of a decode
            # step, relax_passes.GroupQueryHeads), never over the keys
            rows = 1 if mask.dims[-2] == 1 else scores.dims[-2]
            req["mask"] = ShapeFact.shape((*mask.dims[:-2], rows, scores.dims[-1]))
    return port_requirement(**req)


ATTENTION = Candidate("fused_attention", attention_variants, attention_requires, attention_check, priority=60)
