"""SinkReshapes: an elementwise op moves above the reshape that feeds it, only when sound."""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm.script import ir as I
from tvm.script import relax as R

import aicf_tvm
from relax_passes.sink_reshapes import SinkReshapes

from ..conftest import run_vm
from ..helpers import assert_matches_reference, torch_function

TARGET = {"kind": "llvm", "num-cores": 2}


@I.ir_module
class ReshapeThenRelu:
    @R.function
    def main(x: R.Tensor((16, 128), "float32")):
        with R.dataflow():
            r = R.reshape(x, R.shape([1, 16, 128]))
            y = R.nn.relu(r)
            R.output(y)
        return y


@I.ir_module
class ReluThenReshape:
    @R.function
    def main(x: R.Tensor((16, 128), "float32")):
        with R.dataflow():
            y_unshaped = R.nn.relu(x)
            y = R.reshape(y_unshaped, R.shape([1, 16, 128]))
            R.output(y)
        return y


def test_elementwise_moves_above_the_reshape():
    got = SinkReshapes()(ReshapeThenRelu)
    tvm.ir.assert_structural_equal(got["main"], ReluThenReshape["main"], map_free_vars=True)


@I.ir_module
class ScaleThenSigmoid:
    @R.function
    def main(x: R.Tensor((6, 4), "float32")):
        with R.dataflow():
            r = R.reshape(x, R.shape([2, 3, 4]))
            s = R.multiply(r, R.const(0.5, "float32"))
            y = R.sigmoid(s)
            R.output(y)
        return y


def test_a_chain_with_a_scalar_operand_moves_whole():
    got = SinkReshapes()(ScaleThenSigmoid)["main"]
    ops = [b.value.op.name for b in got.body.blocks[0].bindings]
    assert ops == ["relax.multiply", "relax.sigmoid", "relax.reshape"], ops
    x = np.random.default_rng(0).standard_normal((6, 4)).astype("float32")
    np.testing.assert_allclose(run_vm(tvm.IRModule({"main": got}), x)[0], run_vm(ScaleThenSigmoid, x)[0],
                               rtol=1e-6)


@I.ir_module
class ReshapeUsedTwice:
    @R.function
    def main(x: R.Tensor((16, 128), "float32")):
        with R.dataflow():
            r = R.reshape(x, R.shape([1, 16, 128]))
            y = R.nn.relu(r)
            z = R.add(y, r)
            R.output(z)
        return z


@I.ir_module
class ReshapeThenBias:
    @R.function
    def main(x: R.Tensor((16, 128), "float32"), b: R.Tensor((128,), "float32")):
        with R.dataflow():
            r = R.reshape(x, R.shape([1, 16, 128]))
            y = R.add(r, b)
            R.output(y)
        return y


@I.ir_module
class ReshapeThenVectorConstant:
    @R.function
    def main(x: R.Tensor((16, 128), "float32")):
        with R.dataflow():
            r = R.reshape(x, R.shape([4, 4, 128]))
            y = R.add(r, R.const(np.ones((4, 1, 1), "float32")))
            R.output(y)
        return y


def test_no_move_when_a_fact_is_missing():
    """The reshape has a second user; the other operand is a tensor input; or a constant
    with more than one element (it would broadcast differently in the other shape)."""
    for mod in (ReshapeUsedTwice, ReshapeThenBias, ReshapeThenVectorConstant):
        assert tvm_ffi.structural_equal(SinkReshapes()(mod)["main"], mod["main"])


@I.ir_module
class ReshapeThenPrelu:
    """prelu's slope runs along axis 1 of the reshaped value: applied to ``x`` (rank 1)
    the axis would not exist."""

    @R.function
    def main(x: R.Tensor((6,), "float32")):
        with R.dataflow():
            r = R.reshape(x, R.shape([2, 3]))
            y = R.nn.prelu(r, R.const(np.full((1,), 0.25, "float32")), axis=1)
            R.output(y)
        return y


@I.ir_module
class ReshapeThenSoftmax:
    @R.function
    def main(x: R.Tensor((2, 12), "float32")):
        with R.dataflow():
            r = R.reshape(x, R.shape([2, 3, 4]))
            y = R.nn.softmax(r, axis=1)
            R.output(y)
        return y


@I.ir_module
class ReshapeThenLayerNorm:
    @R.function
    def main(x: R.Tensor((2, 12), "float32")):
        with R.dataflow():
            r = R.reshape(x, R.shape([2, 3, 4]))
            y = R.nn.layer_norm(r, R.const(np.full((4,), 2.0, "float32")),
                                R.const(np.full((4,), 0.5, "float32")), axes=[-1])
            R.output(y)
        return y


def test_an_op_with_an_axis_attribute_stays_below_the_reshape():
    """An op whose attrs name an axis is tied to its input's shape: prelu (registered
    broadcast), softmax and layer_norm all keep the reshape in front of them."""
    for mod in (ReshapeThenPrelu, ReshapeThenSoftmax, ReshapeThenLayerNorm):
        got = SinkReshapes()(mod)
        tvm.ir.assert_structural_equal(got["main"], mod["main"])


def test_prelu_after_a_reshape_computes_what_numpy_does():
    x = np.random.default_rng(3).standard_normal(6).astype("float32")
    want = np.where(x > 0, x, 0.25 * x).reshape(2, 3)
    got = run_vm(SinkReshapes()(ReshapeThenPrelu), x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_linear_on_3d_input_fuses_its_activation():
    """torch's Linear on [B, S, H] flattens for the matmul and reshapes back before the
    activation; after the move the activation is the GEMM's epilogue: one kernel per Linear."""
    import torch

    class FFN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(64, 128), torch.nn.Linear(128, 64)

        def forward(self, x):
            return self.b(torch.nn.functional.gelu(self.a(x)))

    torch.manual_seed(0)
    model, x = FFN().eval(), torch.randn(2, 16, 64)
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(model, [x]), target=TARGET)
    gemms = [k for k in compiled.kernels if k.kind == "fused_gemm_bias_act"]
    assert len(gemms) == 2 and not [k for k in compiled.kernels if k.kind == "gelu"]
    inputs = [[x.numpy()], [torch.randn(2, 16, 64).numpy()]]
    assert_matches_reference(compiled, torch_function(model), inputs, rtol=1e-5, atol=1e-5)
