"""fused_conv2d_bias_act's bias: per channel, whatever rank the constant added has.

A convolution without bias followed by ``+ 3`` (hard-swish's ``relu6(x + 3)``) takes the 3
as its bias. The candidate required a bias of shape ``[C]``, and MaterializeEmits broadcast
the 3 to it; ``[C]`` added to NCHW broadcasts along W, so at 16 channels and width 12 the
add no longer type-checked (and at width 1 it would have widened the output to 16). The
references are TVM's default build and, for the hard-swish, numpy in float64.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import aicf_tvm

from ...conftest import run_vm

TARGET = {"kind": "llvm", "num-cores": 2}


def _conv_plus_constant(channels: int, height: int, width: int, constant: np.ndarray,
                        weight: np.ndarray) -> tvm.IRModule:
    """``conv(x) * clip(conv(x) + constant, 0, 6)``: hard-swish without its ``/ 6``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, height, width), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, relax.const(weight), padding=1))
            shifted = bb.emit(relax.op.add(conv, relax.const(constant)))
            out = bb.emit_output(relax.op.multiply(conv, relax.op.clip(shifted, 0, 6)))
        bb.emit_func_output(out)
    return bb.get()


def _reference(x: np.ndarray, weight: np.ndarray, constant: np.ndarray) -> np.ndarray:
    x, weight = x.astype(np.float64), weight.astype(np.float64)
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    h, w = x.shape[2:]
    windows = np.stack([padded[:, :, i:i + h, j:j + w] for i in range(3) for j in range(3)], -1)
    conv = np.einsum("ncHWk,ock->noHW", windows, weight.reshape(*weight.shape[:2], 9))
    return conv * np.clip(conv + constant.astype(np.float64), 0, 6)


@pytest.mark.parametrize("channels, height, width", [(16, 12, 12), (16, 16, 16), (8, 5, 1)],
                         ids=["C16 W12", "C16 W16", "C8 W1"])
@pytest.mark.parametrize("constant_shape", [(), (1,), "C11", "W"])
def test_constant_added_to_a_convolution_keeps_its_broadcast(channels, height, width,
                                                             constant_shape):
    rng = np.random.default_rng(channels * 100 + width)
    shape = {"C11": (channels, 1, 1), "W": (width,)}.get(constant_shape, constant_shape)
    constant = (rng.standard_normal(shape) + 3).astype("float32")
    weight = rng.standard_normal((channels, 3, 3, 3)).astype("float32")
    mod = _conv_plus_constant(channels, height, width, constant, weight)
    compiled = aicf_tvm.compile(mod, target=TARGET)
    x = rng.standard_normal((1, 3, height, width)).astype("float32")
    got = np.asarray(compiled(x))
    np.testing.assert_allclose(got, run_vm(mod, x)[0], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got, _reference(x, weight, constant), rtol=1e-4, atol=1e-3)


def test_scalar_bias_still_fuses_into_the_convolution():
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((16, 3, 3, 3)).astype("float32")
    mod = _conv_plus_constant(16, 12, 12, np.array(3.0, "float32"), weight)
    kinds = [k.kind for k in aicf_tvm.compile(mod, target=TARGET).kernels]
    assert kinds == ["fused_conv2d_bias_act"]
