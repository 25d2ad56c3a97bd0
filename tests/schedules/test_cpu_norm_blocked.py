"""Tests for the CPU rule of LayerNorms over blocked channels (schedules/cpu/norm_blocked.py).

``layer_norm(x, gamma, beta, axes=[1, 4])`` on ``[N, C/b, H, W, b]`` is the LayerNorm over
the channels of the NCHW tensor; the scheduled kernel must match numpy's on the unblocked
values (float64), with and without an epilogue, for widths of one and several vectors.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from schedules import default_rules, schedule_func
from schedules.cpu.norm_blocked import BlockedNorm
from tests.schedules.test_cpu_conv2d_blocked import block
from tests.schedules.test_cpu_gemm import run_scheduled, target

__all__ = ["target"]


def fused_primfunc(build, inputs: dict) -> tvm.tirx.PrimFunc:
    """The one PrimFunc Relax's own fusion makes of ``build`` (two reductions and a map)."""
    params = [relax.Var(name, relax.TensorType(shape, "float32")) for name, shape in inputs.items()]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(bb, *params))
        bb.emit_func_output(out)
    mod = bb.get()
    for t in (relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps(),
              relax.transform.FuseTIR()):
        mod = t(mod)
    [func] = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    return func


def layer_norm_case(c: int, h: int, w: int, b: int, relu: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, c, h, w)).astype("float32") * 3 + 1
    gamma, beta = rng.standard_normal(c).astype("float32"), rng.standard_normal(c).astype("float32")
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=1, keepdims=True)
    want = (x64 - mean) / np.sqrt(var + 1e-6) * gamma[None, :, None, None] + beta[None, :, None, None]
    if relu:
        want = np.maximum(want, 0)
    shapes = {"x": (2, c // b, h, w, b), "g": (c // b, b), "bt": (c // b, b)}

    def build(bb, xv, g, bt):
        y = bb.emit(relax.op.nn.layer_norm(xv, g, bt, axes=[1, 4], epsilon=1e-6))
        return relax.op.nn.relu(y) if relu else y

    arrays = {"x": block(x, b), "g": gamma.reshape(c // b, b), "bt": beta.reshape(c // b, b)}
    return fused_primfunc(build, shapes), arrays, block(want.astype("float32"), b)


@pytest.mark.parametrize("c,h,w,b,relu", [(96, 7, 9, 16, False), (32, 5, 4, 8, True), (16, 3, 3, 16, False)])
def test_blocked_layer_norm_matches_numpy(target, c, h, w, b, relu):
    func, arrays, expected = layer_norm_case(c, h, w, b, relu)
    sch = BlockedNorm().apply(func, target, False)
    assert sch is not None
    got = run_scheduled(sch, target, arrays, expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_default_rules_pick_it_before_fallback(target):
    func, _, _ = layer_norm_case(32, 4, 4, 16, False)
    assert schedule_func(func, target, default_rules(target)).attrs["aicf.schedule"] == "BlockedNorm"


def test_returns_none_for_a_last_axis_layer_norm(target):
    def build(bb, x, g, bt):
        return relax.op.nn.layer_norm(x, g, bt, axes=[-1])

    func = fused_primfunc(build, {"x": (4, 8, 32), "g": (32,), "bt": (32,)})
    assert BlockedNorm().apply(func, target, False) is None
