"""Numeric levels (``aicf_tvm.core.numerics``, ``relax_passes.numeric_levels``).

The default compile is ``exact``: no Emit is relaxed and the report lists no approximation.
``numerics="relaxed"`` relaxes exactly the Emits whose kernels the level changes (exp,
sigmoid, tanh, erf, softmax; fused attention's row sums), each listed in the report with what
changes, its math tag joined with ``approx:relaxed`` and the level on its kernel; a GEMM
and a layer norm stay exact.  Outputs are checked against numpy in float64, at both levels.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm

import aicf_tvm
from aicf_tvm.core.emit import EMIT_ATTR, Emit
from aicf_tvm.core.numerics import NUMERICS_ATTR, RELAXED, RELAXED_MATH
from aicf_tvm.driver.pipeline import run_pipeline
from relax_passes.numeric_levels import DECISION

torch = pytest.importorskip("torch")


class Block(torch.nn.Module):
    """A GEMM, a layer norm, a SiLU and a softmax: two ops the level changes, two it does not."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(64, 96)
        self.norm = torch.nn.LayerNorm(96)
        self.out = torch.nn.Linear(96, 40, bias=False)

    def forward(self, x):
        h = self.norm(self.proj(x))
        return torch.softmax(self.out(torch.nn.functional.silu(h)) * 4.0, dim=-1)


def _reference(model: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    import copy

    with torch.no_grad():
        return copy.deepcopy(model).double()(x.double()).numpy()


def _kernels(mod: tvm.IRModule) -> dict[str, tvm.tirx.PrimFunc]:
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


def test_default_is_exact_and_relaxed_marks_only_what_it_changes():
    torch.manual_seed(0)
    model = Block().eval()
    x, other = torch.randn(32, 64), torch.randn(32, 64)
    mod = aicf_tvm.from_torch(model, (x,))
    want = _reference(model, x)
    assert not np.allclose(want, _reference(model, other))  # the output depends on the input

    exact = aicf_tvm.compile(mod, cache=False)
    assert exact.report.approximations == []
    assert not any(NUMERICS_ATTR in (f.attrs or {}) for f in _kernels(exact.lowered).values())

    relaxed = aicf_tvm.compile(mod, numerics="relaxed", cache=False)
    listed = relaxed.report.approximations
    assert listed and all(d.candidate == DECISION for d in listed)
    notes = " ".join(d.note for d in listed)
    assert "sigmoid in float32" in notes and "softmax's exp in float32" in notes
    kernels = _kernels(relaxed.lowered)
    marked = {name for name, f in kernels.items() if NUMERICS_ATTR in (f.attrs or {})}
    assert marked and marked != set(kernels)  # the GEMM / layer norm kernels stay exact
    for name, func in kernels.items():
        emit = Emit.from_attr(func.attrs[EMIT_ATTR]) if EMIT_ATTR in (func.attrs or {}) else None
        if name in marked:
            assert str(func.attrs[NUMERICS_ATTR]) == RELAXED
            assert emit is not None and emit.math in (RELAXED_MATH, "approx")
            assert any(p.numeric.math.value in (RELAXED_MATH, "approx")
                       for _, p in emit.contract.provides.ports)
        elif emit is not None:
            assert emit.math != RELAXED_MATH

    for compiled in (exact, relaxed):
        got = np.asarray(compiled(x.numpy()))
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_relaxed_attention_sums_rows_per_lane():
    """Fused attention at 128 keys: at the relaxed level the softmax's row sum is split by
    ``rfactor`` (one more ``_rf`` block than the exact level's lane max); both levels
    against numpy's float64 attention."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 4, 128, 32)).astype("float32") for _ in range(3))

    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    args = tuple(torch.from_numpy(a) for a in (q, k, v))
    mod = aicf_tvm.from_torch(Attention(), args)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(32)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v.astype(np.float64))
    rf_blocks = {}
    for level in ("exact", "relaxed"):
        options = aicf_tvm.CompileOptions(numerics=level)
        stages = run_pipeline(mod, "llvm", until="schedule", options=options)
        (attention,) = [f for f in _kernels(stages.lowered).values()
                        if "fused_attention" in str(f.attrs.get("aicf.kind", ""))]
        rf_blocks[level] = attention.script().count('_rf_update"):')
        got = np.asarray(aicf_tvm.compile(mod, options=options, cache=False)(q, k, v))
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    assert rf_blocks["relaxed"] == rf_blocks["exact"] + 1


def test_relaxed_gelu_computes_its_erf_in_float32():
    """A GEMM + GELU (erf) kernel: at ``relaxed`` marked, listed with "erf in float32", and
    its erf evaluated without float64 (the exact level's kernel has float64 arithmetic);
    both against float64 PyTorch, with the output not the exact level's bits."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(96, 160), torch.nn.GELU()).eval()
    x = torch.randn(24, 96) * 3.0
    mod = aicf_tvm.from_torch(model, (x,))
    want = _reference(model, x)
    exact = aicf_tvm.compile(mod, cache=False)
    relaxed = aicf_tvm.compile(mod, numerics="relaxed", cache=False)
    assert "erf in float32" in " ".join(d.note for d in relaxed.report.approximations)

    def float64_ops(compiled) -> int:
        return sum(f.script().count("float64") for f in _kernels(compiled.lowered).values())

    assert float64_ops(exact) > 0 and float64_ops(relaxed) == 0
    got = {name: np.asarray(c(x.numpy())) for name, c in (("exact", exact), ("relaxed", relaxed))}
    for out in got.values():
        np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)
    assert not np.array_equal(got["exact"], got["relaxed"])


def test_unknown_level_is_refused():
    with pytest.raises(ValueError, match="numerics='fast'.*exact, relaxed"):
        aicf_tvm.CompileOptions(numerics="fast")
