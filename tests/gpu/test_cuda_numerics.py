"""CUDA correctness on a GPU: ``aicf_tvm.compile(target="cuda")`` outputs against an
independent float64 numpy reference, TVM's unoptimized LLVM build, PyTorch eager and ONNX
Runtime, each on two different inputs whose reference outputs are checked to differ first.

Skipped where TVM sees no CUDA device (every CI machine); ``scripts/device_check.sh``
runs it on a GPU host.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import aicf_tvm
from aicf_tvm.models import SMALL_SIZES, decoder_block, encoder_layer
from tests.aicf_tvm.test_models import numpy_decoder, numpy_encoder
from tests.conftest import random_inputs, run_vm
from tests.helpers import (
    assert_input_sensitive,
    assert_matches_reference,
    light_model,
    ort_function,
)

pytestmark = pytest.mark.skipif(not tvm.cuda(0).exist, reason="no CUDA device")

CUDA = {"kind": "cuda", "arch": "sm_90"}
# float32 on the GPU (other summation orders, fast math intrinsics) vs float64 / CPU builds
RTOL, ATOL = 2e-3, 2e-3


def activations(shape: tuple[int, ...]) -> list[list[np.ndarray]]:
    """Two different single-input sets (the models' weights come from seed 0)."""
    return [[np.random.default_rng(seed).standard_normal(shape).astype(np.float32)] for seed in (1, 2)]


@pytest.mark.parametrize("sizes", [SMALL_SIZES["encoder_layer"], {}], ids=["small", "bert_base"])
def test_encoder_layer_matches_numpy(sizes):
    mod, weights = encoder_layer(**sizes, return_params=True)
    heads = sizes.get("heads", 12)
    inputs = activations(tuple(int(d) for d in mod["main"].params[0].ty.shape.values))
    assert_matches_reference(aicf_tvm.compile(mod, target=CUDA), lambda x: numpy_encoder(x, weights, heads),
                             inputs, rtol=RTOL, atol=ATOL)


def test_encoder_layer_small_matches_pytorch_eager():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    from tests.gpu.torch_reference import torch_encoder_layer

    sizes = SMALL_SIZES["encoder_layer"]
    mod, weights = encoder_layer(**sizes, return_params=True)
    layer = torch_encoder_layer(weights, sizes["heads"])
    assert_matches_reference(aicf_tvm.compile(mod, target=CUDA),
                             lambda x: layer(torch.from_numpy(x).cuda()).cpu().numpy(),
                             activations((1, sizes["seq"], sizes["hidden"])), rtol=RTOL, atol=ATOL)


def test_decoder_block_small_matches_numpy():
    sizes = SMALL_SIZES["decoder_block"]
    mod, weights = decoder_block(**sizes, return_params=True)
    assert_matches_reference(aicf_tvm.compile(mod, target=CUDA), lambda x: numpy_decoder(x, weights, sizes["heads"]),
                             activations((1, sizes["seq"], sizes["hidden"])), rtol=RTOL, atol=ATOL)


def small_cnn() -> tvm.IRModule:
    """conv+bias+relu, conv+bias+relu, max-pool, global average pool, dense, softmax."""
    rng = np.random.default_rng(0)

    def const(*shape):
        return relax.const((rng.standard_normal(shape) * 0.2).astype("float32"))

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 32, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, const(16, 3, 3, 3), padding=1))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, const(1, 16, 1, 1))))
            y = bb.emit(relax.op.nn.conv2d(y, const(32, 16, 3, 3), strides=2, padding=1))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, const(1, 32, 1, 1))))
            y = bb.emit(relax.op.nn.max_pool2d(y, (2, 2), (2, 2)))
            y = bb.emit(relax.op.reshape(relax.op.nn.adaptive_avg_pool2d(y, (1, 1)), (1, 32)))
            y = bb.emit(relax.op.nn.softmax(relax.op.add(relax.op.matmul(y, const(32, 10)), const(10))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def test_conv_model_matches_tvm_llvm_build():
    mod = small_cnn()  # weights from seed 0, inputs from seeds 1 and 2
    inputs = [random_inputs(mod, seed=s) for s in (1, 2)]
    assert_matches_reference(aicf_tvm.compile(mod, target=CUDA), lambda *args: run_vm(mod, *args)[0],
                             inputs, rtol=RTOL, atol=1e-5)


@pytest.mark.parametrize("name", ["squeezenet", "resnet50"])
def test_light_onnx_model_matches_onnxruntime(name):
    pytest.importorskip("onnxruntime")
    model = light_model(name)
    mod, reference = aicf_tvm.from_onnx(model), ort_function(model)
    inputs = [random_inputs(mod, seed=s) for s in (1, 2)]
    wants = [reference(*args) for args in inputs]
    atol = ATOL * max(float(np.abs(w).max()) for w in wants)
    assert_input_sensitive(wants[0], wants[1], rtol=RTOL, atol=atol)
    compiled = aicf_tvm.compile(mod, target=CUDA)
    for args, want in zip(inputs, wants):
        np.testing.assert_allclose(compiled(*args).reshape(want.shape), want, rtol=RTOL, atol=atol)
