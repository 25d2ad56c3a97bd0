"""Conv1dAsConv2d: a plain-layout conv1d becomes a conv2d over a height of 1, computing the
same function; other layouts stay.

References: PyTorch's ``conv1d`` (independent of TVM) for the compiled modules, and the
unoptimized TVM build of the module before the pass for the pass alone.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import aicf_tvm
from aicf_tvm.driver.pipeline import layout_lanes
from aicf_tvm.runtime.targets import resolve_target
from relax_passes.conv1d_as_conv2d import Conv1dAsConv2d

from ..conftest import run_vm
from .helpers import op_names


def conv1d_module(x_shape, w_shape, constant_weight: np.ndarray | None = None, **attrs) -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    params = [x]
    if constant_weight is None:
        w = relax.Var("w", relax.TensorType(w_shape, "float32"))
        params.append(w)
    else:
        w = relax.const(constant_weight)
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv1d(x, w, **attrs))
        bb.emit_func_output(out)
    return bb.get()


CASES = [  # (channels in, out, taps, length, stride, padding, dilation, groups)
    (16, 32, 3, 40, 1, (1, 1), 1, 1),
    (32, 32, 3, 41, 2, (0, 0), 1, 1),  # Whisper's second convolution, small
    (48, 48, 16, 9, 1, (8, 8), 1, 16),  # wav2vec2's positional convolution, small: groups, wide taps
    (1, 32, 10, 400, 5, (0, 0), 1, 1),  # wav2vec2's first feature layer, small
    (16, 16, 3, 30, 1, (2, 1), 2, 4),  # dilated, asymmetric padding
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:4])) + f"_s{c[4]}_g{c[7]}")
def test_compiled_conv1d_matches_pytorch(case):
    cin, cout, taps, length, stride, padding, dilation, groups = case
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, cin, length)).astype("float32")
    other = rng.standard_normal((1, cin, length)).astype("float32")
    w = rng.standard_normal((cout, cin // groups, taps)).astype("float32")
    mod = conv1d_module(x.shape, w.shape, constant_weight=w, strides=stride, padding=padding,
                        dilation=dilation, groups=groups)
    assert op_names(Conv1dAsConv2d()(mod)).count("relax.nn.conv2d") == 1
    compiled = aicf_tvm.compile(mod, target="llvm")

    def reference(data):
        padded = torch.nn.functional.pad(torch.from_numpy(data), padding)
        return torch.nn.functional.conv1d(padded, torch.from_numpy(w), stride=stride, dilation=dilation,
                                          groups=groups).numpy()

    got, got_other = (np.asarray(compiled(d)) for d in (x, other))
    assert not np.allclose(reference(x), reference(other))
    np.testing.assert_allclose(got, reference(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_other, reference(other), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(layout_lanes(resolve_target("llvm")) is None, reason="no blocked layouts here")
def test_wav2vec2s_positional_convolution_takes_the_blocked_direct_schedule():
    """768 channels in 16 groups, 128 taps over 49 frames: as a conv1d only the im2col GEMM
    took it (10.8 ms on 2 Zen 4 cores), as the conv2d the blocked direct convolution (2.2 ms)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 768, 49)).astype("float32")
    w = (rng.standard_normal((768, 48, 128)) / 64).astype("float32")
    mod = conv1d_module(x.shape, w.shape, constant_weight=w, padding=(64, 64), groups=16)
    compiled = aicf_tvm.compile(mod, target="llvm")
    assert "BlockedConv2d" in [k.schedule for k in compiled.kernels]
    ref = torch.nn.functional.conv1d(torch.from_numpy(x), torch.from_numpy(w), padding=64, groups=16).numpy()
    np.testing.assert_allclose(np.asarray(compiled(x)), ref, rtol=1e-5, atol=1e-5)


def test_the_pass_alone_keeps_the_function_and_a_variable_weight():
    """A weight that is a parameter gets an ``expand_dims``; the module before and after the
    pass, both built by TVM's default pipeline, agree."""
    x = np.random.default_rng(1).standard_normal((1, 8, 20)).astype("float32")
    w = np.random.default_rng(2).standard_normal((12, 4, 5)).astype("float32")
    before = conv1d_module(x.shape, w.shape, strides=2, padding=(2, 1), groups=2)
    after = Conv1dAsConv2d()(before)
    assert "relax.nn.conv1d" not in op_names(after) and "relax.expand_dims" in op_names(after)
    np.testing.assert_allclose(run_vm(after, x, w)[0], run_vm(before, x, w)[0], rtol=1e-5, atol=1e-5)


def test_a_channels_last_conv1d_stays():
    mod = conv1d_module((1, 20, 8), (12, 8, 3), data_layout="NWC", out_layout="NWC")
    assert op_names(Conv1dAsConv2d()(mod)) == op_names(mod)


@pytest.mark.skipif(layout_lanes(resolve_target("llvm")) is None, reason="no blocked layouts here")
def test_the_bias_and_activation_join_the_convolutions_epilogue():
    """Whisper's front convolution, small: ``gelu(conv1d(x) + b)`` from PyTorch. The bias
    is moved above the reshape back to 3-D, ``SinkReshapes`` moves the GELU, and the blocked
    convolution computes all three in one kernel."""
    torch.manual_seed(0)

    class Front(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv1d(80, 384, 3, padding=1)

        def forward(self, x):
            return torch.nn.functional.gelu(self.conv(x))

    model = Front().eval()
    x, other = torch.randn(1, 80, 50), torch.randn(1, 80, 50)
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(model, (x,)), target="llvm")
    assert any("conv2d_bias_act" in k.name and k.schedule == "BlockedConv2d" for k in compiled.kernels)
    for data in (x, other):
        np.testing.assert_allclose(np.asarray(compiled(data.numpy())), model(data).detach().numpy(),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 16, 18), (1, 1, 16, 1)], ids=["per-element", "broadcast-to-4d"])
def test_an_add_that_is_not_a_bias_stays_below_the_reshape(shape):
    """``conv1d(x) + y`` with ``y [1, C, W]`` (a value per element) or ``y [1, 1, C, 1]``
    (per channel, but the sum is 4-D): not a bias of the 3-D convolution."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 8, 20)).astype("float32")
    w = rng.standard_normal((16, 8, 3)).astype("float32")
    y = rng.standard_normal(shape).astype("float32")
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [xv]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv1d(xv, relax.const(w)))
            out = bb.emit_output(relax.op.add(conv, relax.const(y)))
        bb.emit_func_output(out)
    before = bb.get()
    after = Conv1dAsConv2d()(before)
    found = op_names(after)
    assert found.index("relax.reshape") < found.index("relax.add")
    np.testing.assert_allclose(run_vm(after, x)[0], run_vm(before, x)[0], rtol=1e-5, atol=1e-5)
