"""A GEMM whose B is an int8 constant cast to float (``linear(x, float(q)) * scale``, the
form of ``compile_causal_lm(weights="int8")``): the cast joins the GEMM Emit, the weight
stays int8 in the library (prepacked as int8), the GEMM rule schedules it, and the result
equals float64 arithmetic on the same integers; with B as stored ([K, N]) and transposed
([N, K], a Linear's), for one row (decode), a few rows and a symbolic row count."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

import aicf_tvm
from tests.helpers import relax_constants

K, N = 96, 80


def _module(rows, transposed: bool, weight: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, K), "float32"))
    bounds = {"tir_var_upper_bound": {"m": 64}} if not isinstance(rows, int) else {}
    with bb.function("main", [x], attrs=bounds):
        with bb.dataflow():
            w = bb.emit(relax.op.astype(relax.const(weight), "float32"))
            if transposed:
                w = bb.emit(relax.op.permute_dims(w))
            y = bb.emit(relax.op.matmul(x, w))
            y = bb.emit(relax.op.multiply(y, relax.const(scale)))
            y = bb.emit_output(relax.op.add(y, relax.const(bias)))
        bb.emit_func_output(y)
    return bb.get()


@pytest.mark.parametrize("transposed", [True, False])
@pytest.mark.parametrize("rows", [1, 5, "m"])
def test_an_int8_weight_gemm_reads_int8_and_equals_float64(rows, transposed):
    rng = np.random.default_rng(3)
    shape = (N, K) if transposed else (K, N)
    weight = rng.integers(-127, 128, shape).astype("int8")
    scale = (rng.random(N) + 0.5).astype("float32") / 127
    bias = rng.standard_normal(N).astype("float32")
    dims = tirx.Var("m", "int64") if rows == "m" else rows
    model = aicf_tvm.compile(_module(dims, transposed, weight, scale, bias))
    gemms = [k for k in model.kernels if k.kind == "fused_gemm_bias_act"]
    assert len(gemms) == 1 and gemms[0].schedule == "Gemm" and len(model.kernels) == 1
    consts = relax_constants(model.lowered)
    assert sum(int(np.prod([int(d) for d in c.ty.shape])) for c in consts if str(c.ty.dtype) == "int8") >= K * N
    assert not any(str(c.ty.dtype) == "float32" and int(np.prod([int(d) for d in c.ty.shape])) >= K * N
                   for c in consts)  # no float copy of the weight, packed or not
    w64 = weight.astype(np.float64).T if transposed else weight.astype(np.float64)
    outs = []
    for n in ((1, 5) if rows == "m" else (rows,)) * 2:
        x = rng.standard_normal((n, K)).astype("float32")
        got = model(x)
        got = got.numpy() if hasattr(got, "numpy") else got
        want = (x.astype(np.float64) @ w64) * scale + bias
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
        outs.append(got)
    assert not np.array_equal(outs[0], outs[-1])
