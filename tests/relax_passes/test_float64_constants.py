"""Constants our passes build keep a float64 model's dtype (``relax.const`` of a numpy
float64 array makes a float32 constant, and the float64 op then refused it): a float64
conv1d (Conv1dAsConv2d) and a batch norm folded into a float64 conv (FoldBatchNorm)
compile and compute in float64, against numpy."""

from __future__ import annotations

import numpy as np
from tvm import relax

import aicf_tvm


def _compile(params, body):
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(*params))
        bb.emit_func_output(out)
    return aicf_tvm.compile(bb.get(), cache=False)


def test_a_float64_conv1d_computes_in_float64():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4, 3))
    model = _compile([relax.Var("x", relax.TensorType((1, 4, 16), "float64"))],
                     lambda x: relax.op.nn.conv1d(x, relax.const(w, "float64")))
    x = rng.standard_normal((1, 4, 16))
    want = np.stack([sum(np.convolve(x[0, c], w[o, c][::-1], mode="valid") for c in range(4)) for o in range(8)])
    got = np.asarray(model(x))
    assert got.dtype == np.float64
    np.testing.assert_allclose(got[0], want, rtol=1e-12, atol=1e-12)


def test_a_batch_norm_folded_into_a_float64_conv_stays_float64():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 3, 1, 1))
    gamma, beta, mean = rng.standard_normal(6), rng.standard_normal(6), rng.standard_normal(6)
    var = rng.uniform(0.5, 2.0, 6)

    def body(x):
        conv = relax.op.nn.conv2d(x, relax.const(w, "float64"))
        bn = relax.op.nn.batch_norm(conv, *(relax.const(v, "float64") for v in (gamma, beta, mean, var)),
                                    axis=1, epsilon=1e-5, training=False)
        return relax.TupleGetItem(bn, 0)

    model = _compile([relax.Var("x", relax.TensorType((1, 3, 5, 5), "float64"))], body)
    x = rng.standard_normal((1, 3, 5, 5))
    conv = np.einsum("oc,nchw->nohw", w[:, :, 0, 0], x)
    scale = (gamma / np.sqrt(var + 1e-5))[None, :, None, None]
    want = (conv - mean[None, :, None, None]) * scale + beta[None, :, None, None]
    got = np.asarray(model(x))
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
