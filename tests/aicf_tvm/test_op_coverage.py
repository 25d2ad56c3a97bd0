"""Ops outside the fused library compile and agree with numpy: creation ops with no
tensor input (a causal mask from arange), scans and sorts (TVM's sort/scan dispatch, never
fused with their neighbours), and unsupported PyTorch ops get our own error."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

import aicf_tvm
from aicf_tvm.errors import UnsupportedModelError

TARGET = {"kind": "llvm", "num-cores": 2}


def _build(params, body):
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def test_causal_mask_from_arange_is_computed_at_compile_time():
    """arange takes no tensor: its Emit is folded to a constant, not lowered as a kernel."""
    s = relax.Var("s", relax.TensorType((2, 9, 9), "float32"))

    def body(bb, scores):
        i = relax.op.arange(0, 9, 1, "int64")
        allowed = relax.op.less_equal(relax.op.expand_dims(i, 0), relax.op.expand_dims(i, 1))
        masked = relax.op.where(allowed, scores, relax.const(float("-inf"), "float32"))
        return relax.op.nn.softmax(masked, axis=-1)

    compiled = aicf_tvm.compile(_build([s], body), target=TARGET)
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

    compiled = aicf_tvm.compile(_build([x], body), target=TARGET)
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

    compiled = aicf_tvm.compile(_build([x], body), target=TARGET)
    xv = np.random.default_rng(2).permutation(48).reshape(4, 12).astype("float32")  # no ties
    want = {"sort": np.maximum(np.sort(xv, -1), 0), "argsort": np.argsort(xv, -1).astype("int32"),
            "topk": -np.sort(-xv, -1)[:, :3] + 1}[op]
    np.testing.assert_allclose(compiled(xv), want)


def test_unsupported_torch_op_names_the_op():
    torch = pytest.importorskip("torch")

    class Amax(torch.nn.Module):
        def forward(self, x):
            return x.amax(dim=(2, 3))

    with pytest.raises(UnsupportedModelError, match=r"amax.*not supported by TVM's PyTorch frontend"):
        aicf_tvm.from_torch(Amax(), [torch.randn(1, 2, 3, 3)])
