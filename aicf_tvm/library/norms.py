"""fused_softmax, fused_layernorm, fused_rmsnorm: two reductions in one kernel.

Each matches the single Relax op with an optional residual add feeding it, and the
written-out form ONNX exporters produce (max/exp/sum/divide; mean/subtract/variance/
sqrt/divide/affine; square/mean/rsqrt/scale), which TVM's FuseOps splits into one
kernel per reduction.
"""

from __future__ import annotations

from tvm.relax import dpl

from aicf_tvm.core.candidate import Candidate, Match, Variant, commutative, op, port_requirement
from aicf_tvm.core.lattice import ShapeFact


def _with_residual(core_of, roles: dict) -> list[Variant]:
    """Variants with and without a residual add feeding the normalized input."""
    x = dpl.wildcard()
    plain = dict(roles, x=x)
    out = [(core_of(x, plain), plain)]
    a, b = dpl.wildcard(), dpl.wildcard()
    res = dict(roles, x=a, residual=b)
    res["residual_add"] = op("relax.add")(a, b)
    out.insert(0, (core_of(res["residual_add"], res), res))
    return out


def softmax_variants() -> list[Variant]:
    def single(x, r):
        r["softmax"] = op("relax.nn.softmax")(x)
        return r["softmax"]

    def written(x, r):
        r["max"] = op("relax.max")(x)
        r["exp"] = op("relax.exp")(op("relax.subtract")(x, r["max"]))
        r["sum"] = op("relax.sum")(r["exp"])
        r["softmax"] = op("relax.divide")(r["exp"], r["sum"])
        return r["softmax"]

    return _with_residual(written, {}) + _with_residual(single, {})


def layernorm_variants() -> list[Variant]:
    def single(x, r):
        r["gamma"], r["beta"] = dpl.wildcard(), dpl.wildcard()
        r["norm"] = op("relax.nn.layer_norm")(x, r["gamma"], r["beta"])
        return r["norm"]

    def written(x, r):
        r["mean"] = op("relax.mean")(x)
        d = op("relax.subtract")(x, r["mean"])
        var = op("relax.mean")(op("relax.power")(d, dpl.wildcard()) | op("relax.multiply")(d, d))
        eps = commutative("relax.add", var, dpl.wildcard())
        normed = op("relax.divide")(d, op("relax.sqrt")(eps)) | commutative("relax.multiply", d, op("relax.rsqrt")(eps))
        r["gamma"], r["beta"] = dpl.wildcard(), dpl.wildcard()
        r["norm"] = commutative("relax.add", commutative("relax.multiply", normed, r["gamma"]), r["beta"])
        return r["norm"]

    return _with_residual(written, {}) + _with_residual(single, {})


def rmsnorm_variants() -> list[Variant]:
    def single(x, r):
        r["gamma"] = dpl.wildcard()
        r["norm"] = op("relax.nn.rms_norm")(x, r["gamma"])
        return r["norm"]

    def written(x, r):
        sq = op("relax.multiply")(x, x) | op("relax.power")(x, dpl.wildcard())
        eps = commutative("relax.add", op("relax.mean")(sq), dpl.wildcard())
        normed = commutative("relax.multiply", x, op("relax.rsqrt")(eps))
        r["gamma"] = dpl.wildcard()
        r["norm"] = commutative("relax.multiply", normed, r["gamma"])
        return r["norm"]

    return _with_residual(written, {}) + _with_residual(single, {})


def _last_axis(m: Match, role: str, attr: str) -> str | None:
    x = m.shapes.get("x", ShapeFact.top())
    axes = m.attr(role, attr)
    if axes is None:
        return None
    axes = [int(a) for a in (axes if hasattr(axes, "__len__") else [axes])]
    nd = x.ndim
    if not nd or [a % nd for a in axes] != [nd - 1]:  # rank 0 has no last axis (fuzz_529a2d0dba)
        return f"shape: reduction axes {axes} are not the last axis of a rank-{nd} input"
    return None


def softmax_check(m: Match) -> str | None:
    if m.has("max"):
        for role in ("max", "sum"):
            if _last_axis(m, role, "axis"):
                return _last_axis(m, role, "axis")
        return None
    return _last_axis(m, "softmax", "axis")


def norm_check(m: Match) -> str | None:
    return _last_axis(m, "mean" if m.has("mean") else "norm", "axis" if m.has("mean") else "axes")


def residual_requires(m: Match):
    x = m.shapes.get("x", ShapeFact.top())
    req = {}
    if m.has("residual") and x.dims is not None:
        req["residual"] = ShapeFact.shape(x.dims)  # no broadcasting into a norm's input
    if m.has("gamma") and x.dims:
        g = m.shapes.get("gamma", ShapeFact.top())
        req["gamma"] = ShapeFact.shape((1,) * ((g.ndim or 1) - 1) + (x.dims[-1],))
    return port_requirement(**req)


SOFTMAX = Candidate("fused_softmax", softmax_variants, residual_requires, softmax_check, priority=40)
LAYERNORM = Candidate("fused_layernorm", layernorm_variants, residual_requires, norm_check, priority=40)
RMSNORM = Candidate("fused_rmsnorm", rmsnorm_variants, residual_requires, norm_check, priority=40)
