"""Ops outside the fused library compile and agree with numpy: creation ops with no
tensor input (a causal mask from arange), scans and sorts (TVM's sort/scan dispatch, never
fused with their neighbours), scatters and median (TOPI extern code, never fused), and
unsupported PyTorch ops get our own error."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

import aicf_tvm
from aicf_tvm.core.errors import UnsupportedModelError

from ...helpers import relax_main

TARGET = {"kind": "llvm", "num-cores": 2}


def test_causal_mask_from_arange_is_computed_at_compile_time():
    """arange takes no tensor: its Emit is folded to a constant, not lowered as a kernel."""
    s = relax.Var("s", relax.TensorType((2, 9, 9), "float32"))

    def body(bb, scores):
        i = relax.op.arange(0, 9, 1, "int64")
        allowed = relax.op.less_equal(relax.op.expand_dims(i, 0), relax.op.expand_dims(i, 1))
        masked = relax.op.where(allowed, scores, relax.const(float("-inf"), "float32"))
        return relax.op.nn.softmax(masked, axis=-1)

    compiled = aicf_tvm.compile(relax_main([s], body), target=TARGET)
    assert not [k for k in compiled.kernels if k.kind == "arange"]
    x = np.random.default_rng(0).standard_normal((2, 9, 9)).astype("float32")
    masked = np.where(np.tril(np.ones((9, 9), bool)), x, -np.inf)
    e = np.exp(masked - masked.max(-1, keepdims=True))
    np.testing.assert_allclose(compiled(x), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_scan_between_elementwise_ops_is_its_own_kernel():
    x = relax.Var("x", relax.TensorType((3, 16), "float32"))

    def body(bb, v):
        y = relax.op.cumsum(relax.op.nn.relu(v), axis=-1)
        return relax.op.multiply(y, relax.const(0.5, "float32"))

    compiled = aicf_tvm.compile(relax_main([x], body), target=TARGET)
    xv = np.random.default_rng(1).standard_normal((3, 16)).astype("float32")
    np.testing.assert_allclose(compiled(xv), np.cumsum(np.maximum(xv, 0), -1) * 0.5, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["sort", "argsort", "topk"])
def test_sorts_compile_and_match_numpy(op):
    x = relax.Var("x", relax.TensorType((4, 12), "float32"))

    def body(bb, v):
        if op == "sort":
            return relax.op.nn.relu(relax.op.sort(v, axis=-1))
        if op == "argsort":
            return relax.op.argsort(v, axis=-1, dtype="int32")
        values = bb.emit(relax.op.topk(v, k=3, axis=-1, ret_type="values"))
        return relax.op.add(values, relax.const(1.0, "float32"))

    compiled = aicf_tvm.compile(relax_main([x], body), target=TARGET)
    xv = np.random.default_rng(2).permutation(48).reshape(4, 12).astype("float32")  # no ties
    want = {"sort": np.maximum(np.sort(xv, -1), 0), "argsort": np.argsort(xv, -1).astype("int32"),
            "topk": -np.sort(-xv, -1)[:, :3] + 1}[op]
    np.testing.assert_allclose(compiled(xv), want)


def _scatter_model(op):
    """exp(x) scattered with -u at indices that an elementwise Emit maps from negative to
    positive (as the ONNX frontend does for ScatterND), then relu: TOPI's scatter is
    ir_builder code, so its neighbours are separate kernels."""
    x = relax.Var("x", relax.TensorType((8, 6), "float32"))
    shape = (3, 6) if op == "scatter_elements" else (3, 1)
    idx = relax.Var("idx", relax.TensorType(shape, "int64"))
    u = relax.Var("u", relax.TensorType((3, 6), "float32"))

    def body(bb, x, idx, u):
        wrapped = relax.op.where(relax.op.less(idx, relax.const(0, "int64")),
                                 relax.op.add(idx, relax.const(8, "int64")), idx)
        scatter = (relax.op.scatter_elements(relax.op.exp(x), wrapped, relax.op.negative(u), axis=0)
                   if op == "scatter_elements" else
                   relax.op.scatter_nd(relax.op.exp(x), wrapped, relax.op.negative(u)))
        return relax.op.nn.relu(scatter)

    return relax_main([x, idx, u], body)


@pytest.mark.parametrize("op", ["scatter_elements", "scatter_nd"])
def test_scatter_with_elementwise_neighbours_matches_numpy(op):
    compiled = aicf_tvm.compile(_scatter_model(op), target=TARGET)
    assert op in [k.kind for k in compiled.kernels]
    rng = np.random.default_rng(7)
    x = rng.standard_normal((8, 6)).astype("float32")
    u = rng.standard_normal((3, 6)).astype("float32")
    rows = np.stack([rng.permutation(8)[:3] for _ in range(6)], axis=1)  # distinct rows per column
    idx = np.where(rng.random(rows.shape) < 0.5, rows - 8, rows)  # some negative, same rows
    want = np.exp(x)
    if op == "scatter_elements":
        np.put_along_axis(want, rows, -u, axis=0)
    else:
        idx, rows = idx[:, :1], rows[:, :1]
        want[rows[:, 0]] = -u
    np.testing.assert_allclose(compiled(x, idx, u), np.maximum(want, 0), rtol=1e-6, atol=1e-6)


def test_median_between_elementwise_ops_matches_numpy():
    """median sorts with TOPI's extern argsort: its own kernel."""
    x = relax.Var("x", relax.TensorType((5, 7), "float32"))
    compiled = aicf_tvm.compile(relax_main([x], lambda bb, v: relax.op.exp(relax.op.median(relax.op.exp(v)))),
                                target=TARGET)
    assert "median" in [k.kind for k in compiled.kernels]
    xv = np.random.default_rng(8).standard_normal((5, 7)).astype("float32")
    np.testing.assert_allclose(compiled(xv), np.exp(np.median(np.exp(xv))), rtol=1e-6)


def test_unsupported_torch_op_names_the_op():
    torch = pytest.importorskip("torch")

    class Amax(torch.nn.Module):
        def forward(self, x):
            return x.amax(dim=(2, 3))

    with pytest.raises(UnsupportedModelError, match=r"amax.*not supported by TVM's PyTorch frontend"):
        aicf_tvm.from_torch(Amax(), [torch.randn(1, 2, 3, 3)])
