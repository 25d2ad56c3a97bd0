"""FoldBatchNorm: batch-norm folds into the conv before it only where that is the same
function; every other batch-norm is decomposed by its own training flag."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from aicf_tvm.core.errors import UnsupportedModelError
from relax_passes.fold_batch_norm import FoldBatchNorm

from ..conftest import run_vm
from .helpers import op_names

CHANNELS = 4
_KERNEL_SHAPES = {"OIHW": (CHANNELS, 3, 3, 3), "HWIO": (3, 3, 3, CHANNELS),
                  "OHWI": (CHANNELS, 3, 3, 3)}


def conv_bn(rng: np.random.Generator, *, center: bool = True, scale: bool = True,
            training: bool = False, data_layout: str = "NCHW", kernel_layout: str = "OIHW",
            axis: int = 1, dtype: str = "float32", weight_scale: float = 1.0, gamma_scale: float = 1.0,
            consts: dict | None = None) -> tuple[tvm.IRModule, tuple]:
    """``batch_norm(conv2d(x, W), gamma, beta, mean, var)[0]`` with distinct random
    constants (also stored into ``consts`` when given)."""
    x_shape = (2, 3, 6, 6) if data_layout == "NCHW" else (2, 6, 6, 3)
    weight = (rng.standard_normal(_KERNEL_SHAPES[kernel_layout]) * weight_scale).astype(dtype)
    gamma = (rng.standard_normal(CHANNELS) * gamma_scale).astype(dtype)
    beta, mean = (rng.standard_normal(CHANNELS).astype(dtype) for _ in range(2))
    var = rng.uniform(0.5, 2.0, CHANNELS).astype(dtype)
    if consts is not None:
        consts.update(weight=weight, gamma=gamma, beta=beta, mean=mean, var=var)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(x, relax.const(weight), data_layout=data_layout,
                                           kernel_layout=kernel_layout))
            stats = [relax.const(v) for v in (gamma, beta, mean, var)]
            bn = bb.emit(relax.op.nn.batch_norm(c, *stats, axis=axis, center=center, scale=scale,
                                                training=training))
            out = bb.emit_output(bn[0])
        bb.emit_func_output(out)
    return bb.get(), x_shape


@pytest.mark.parametrize("center,scale",
                         [(True, True), (False, False), (True, False), (False, True)])
def test_fold_honours_center_and_scale(center, scale):
    """gamma scales only when ``scale``, beta shifts only when ``center`` (the constants are
    far from 1 and 0, so folding either in regardless would show)."""
    rng = np.random.default_rng(0)
    mod, x_shape = conv_bn(rng, center=center, scale=scale)
    got = FoldBatchNorm()(mod)
    assert op_names(got) == ["relax.nn.conv2d", "relax.add"]
    x = rng.standard_normal(x_shape).astype("float32")
    np.testing.assert_allclose(run_vm(got, x)[0], run_vm(mod, x)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel_layout", ["HWIO", "OHWI"])
def test_nhwc_conv_folds_along_its_channel_axis(kernel_layout):
    rng = np.random.default_rng(1)
    mod, x_shape = conv_bn(rng, data_layout="NHWC", kernel_layout=kernel_layout, axis=3)
    got = FoldBatchNorm()(mod)
    assert op_names(got) == ["relax.nn.conv2d", "relax.add"]
    x = rng.standard_normal(x_shape).astype("float32")
    np.testing.assert_allclose(run_vm(got, x)[0], run_vm(mod, x)[0], rtol=1e-5, atol=1e-5)


def test_conv1d_folds_too():
    rng = np.random.default_rng(9)
    weight, gamma, beta, mean = (rng.standard_normal(s).astype("float32")
                                 for s in ((5, 2, 3), (5,), (5,), (5,)))
    var = rng.uniform(0.5, 2.0, 5).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 2, 9), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv1d(x, relax.const(weight)))
            bn = bb.emit(relax.op.nn.batch_norm(c, *[relax.const(v) for v in (gamma, beta, mean, var)],
                                                axis=1, training=False))
            out = bb.emit_output(bn[0])
        bb.emit_func_output(out)
    mod = bb.get()
    got = FoldBatchNorm()(mod)
    assert op_names(got) == ["relax.nn.conv1d", "relax.add"]
    xv = rng.standard_normal((1, 2, 9)).astype("float32")
    np.testing.assert_allclose(run_vm(got, xv)[0], run_vm(mod, xv)[0], rtol=1e-5, atol=1e-5)


def test_no_fold_when_the_axis_is_not_the_conv_channel():
    """NCHW conv output [2, 4, 4, 4] normalized along H (also 4 wide): decomposed, not folded."""
    rng = np.random.default_rng(2)
    mod, x_shape = conv_bn(rng, axis=2)
    got = FoldBatchNorm()(mod)
    assert "relax.nn.batch_norm" not in op_names(got) and op_names(got).count("relax.sqrt") == 1
    x = rng.standard_normal(x_shape).astype("float32")
    np.testing.assert_allclose(run_vm(got, x)[0], run_vm(mod, x)[0], rtol=1e-5, atol=1e-5)


def numpy_conv_bn(x: np.ndarray, c: dict, eps: float = 1e-5) -> np.ndarray:
    """NCHW/OIHW valid conv, then inference batch-norm, in float64."""
    windows = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (3, 3), axis=(2, 3))
    y = np.einsum("nchwij,ocij->nohw", windows, c["weight"].astype(np.float64))
    ch = (1, -1, 1, 1)
    g, b, m, v = (c[k].astype(np.float64).reshape(ch) for k in ("gamma", "beta", "mean", "var"))
    return (y - m) / np.sqrt(v + eps) * g + b


def test_float16_folds_in_float16():
    """TVM's fold added a float32 epsilon to the float16 variance (a TypeError). The
    reference is numpy: TVM's own float16 batch_norm legalization returns float32 data."""
    rng = np.random.default_rng(3)
    consts: dict = {}
    mod, x_shape = conv_bn(rng, dtype="float16", consts=consts)
    got = FoldBatchNorm()(mod)
    assert op_names(got) == ["relax.nn.conv2d", "relax.add"]
    x = rng.standard_normal(x_shape).astype("float16")
    out = run_vm(got, x)[0]
    assert out.dtype == np.float16
    np.testing.assert_allclose(out, numpy_conv_bn(x, consts), rtol=1e-2, atol=3e-2)


def test_no_fold_when_the_folded_weight_would_overflow():
    """W * s beyond float16's range, while conv then batch-norm stays finite: decomposed."""
    rng = np.random.default_rng(4)
    consts: dict = {}
    mod, x_shape = conv_bn(rng, dtype="float16", weight_scale=1e4, gamma_scale=1e2, consts=consts)
    got = FoldBatchNorm()(mod)
    assert "relax.nn.batch_norm" not in op_names(got) and op_names(got)[0] == "relax.nn.conv2d"
    assert op_names(got).count("relax.sqrt") == 1
    x = (rng.standard_normal(x_shape) * 1e-4).astype("float16")
    want = numpy_conv_bn(x, consts)
    assert np.isfinite(want).all() and np.abs(want).max() < 6e4
    np.testing.assert_allclose(run_vm(got, x)[0], want, rtol=1e-2, atol=np.abs(want).max() * 1e-2)


def batch_norm_only(rng: np.random.Generator, training: bool) -> tuple[tvm.IRModule, dict]:
    """All three outputs of ``batch_norm(x, ...)`` on [2, 3, 4, 5], axis 1."""
    stats = {k: rng.standard_normal(3).astype("float32") for k in ("gamma", "beta", "mean")}
    stats["var"] = rng.uniform(0.5, 2.0, 3).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3, 4, 5), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            consts = [relax.const(stats[k]) for k in ("gamma", "beta", "mean", "var")]
            bn = bb.emit(relax.op.nn.batch_norm(x, *consts, axis=1, epsilon=1e-3, momentum=0.25,
                                                training=training))
            out = bb.emit_output(relax.Tuple([bn[0], bn[1], bn[2]]))
        bb.emit_func_output(out)
    return bb.get(), stats


def test_training_mode_normalizes_by_the_batch_statistics():
    """``training=True`` (Relax's default) means the batch's mean and variance, and moving
    statistics updated by momentum: numpy's reading of the op, not the moving statistics."""
    rng = np.random.default_rng(5)
    mod, s = batch_norm_only(rng, training=True)
    x = rng.standard_normal((2, 3, 4, 5)).astype("float32")
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    c = (1, 3, 1, 1)
    norm = (x - mean.reshape(c)) / np.sqrt(var.reshape(c) + 1e-3)
    want = [norm * s["gamma"].reshape(c) + s["beta"].reshape(c),
            0.75 * s["mean"] + 0.25 * mean, 0.75 * s["var"] + 0.25 * var]
    got = FoldBatchNorm()(mod)
    assert "relax.nn.batch_norm" not in op_names(got)
    for g, w in zip(run_vm(got, x), want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_inference_mode_normalizes_by_the_moving_statistics():
    rng = np.random.default_rng(6)
    mod, s = batch_norm_only(rng, training=False)
    x = rng.standard_normal((2, 3, 4, 5)).astype("float32")
    c = (1, 3, 1, 1)
    want = [(x - s["mean"].reshape(c)) / np.sqrt(s["var"].reshape(c) + 1e-3) * s["gamma"].reshape(c)
            + s["beta"].reshape(c), s["mean"], s["var"]]
    for g, w in zip(run_vm(FoldBatchNorm()(mod), x), want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_training_mode_conv_is_never_folded():
    rng = np.random.default_rng(7)
    mod, x_shape = conv_bn(rng, training=True)
    got = FoldBatchNorm()(mod)
    assert {"relax.mean", "relax.variance"} <= set(op_names(got))
    x = rng.standard_normal(x_shape).astype("float32")
    np.testing.assert_allclose(run_vm(got, x)[0], run_vm(mod, x)[0], rtol=1e-5, atol=1e-5)


def test_no_change_without_batch_norm_and_idempotent():
    rng = np.random.default_rng(8)
    folded = FoldBatchNorm()(conv_bn(rng)[0])
    assert tvm_ffi.structural_equal(FoldBatchNorm()(folded), folded)


def test_unknown_rank_is_refused_by_name():
    x = relax.Var("x", relax.TensorType(None, "float32", ndim=-1))
    stats = [relax.const(np.ones(3, "float32")) for _ in range(4)]
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.batch_norm(x, *stats, axis=1))[0])
        bb.emit_func_output(out)
    with pytest.raises(UnsupportedModelError, match="batch_norm on x of unknown rank"):
        FoldBatchNorm()(bb.get())
