"""CUDA correctness on a GPU: ``aicf_tvm.compile(target="cuda")`` outputs against an
independent float64 numpy reference, TVM's unoptimized LLVM build and PyTorch eager.

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
from tests.conftest import light_model_path, random_inputs, run_vm

pytestmark = pytest.mark.skipif(not tvm.cuda(0).exist, reason="no CUDA device")

CUDA = {"kind": "cuda", "arch": "sm_90"}
# float32 on the GPU (other summation orders, fast math intrinsics) vs float64 / CPU builds
RTOL, ATOL = 2e-3, 2e-3


def activation(shape: tuple[int, ...], seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("sizes", [SMALL_SIZES["encoder_layer"], {}], ids=["small", "bert_base"])
def test_encoder_layer_matches_numpy(sizes):
    mod, weights = encoder_layer(**sizes, return_params=True)
    heads = sizes.get("heads", 12)
    x = activation(tuple(int(d) for d in mod["main"].params[0].ty.shape.values))
    out = aicf_tvm.compile(mod, target=CUDA)(x)
    np.testing.assert_allclose(out, numpy_encoder(x, weights, heads), rtol=RTOL, atol=ATOL)


def test_encoder_layer_small_matches_pytorch_eager():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    from tests.gpu.torch_reference import torch_encoder_layer

    sizes = SMALL_SIZES["encoder_layer"]
    mod, weights = encoder_layer(**sizes, return_params=True)
    x = activation((1, sizes["seq"], sizes["hidden"]))
    expected = torch_encoder_layer(weights, sizes["heads"])(torch.from_numpy(x).cuda()).cpu().numpy()
    np.testing.assert_allclose(aicf_tvm.compile(mod, target=CUDA)(x), expected, rtol=RTOL, atol=ATOL)


def test_decoder_block_small_matches_numpy():
    sizes = SMALL_SIZES["decoder_block"]
    mod, weights = decoder_block(**sizes, return_params=True)
    x = activation((1, sizes["seq"], sizes["hidden"]))
    out = aicf_tvm.compile(mod, target=CUDA)(x)
    np.testing.assert_allclose(out, numpy_decoder(x, weights, sizes["heads"]), rtol=RTOL, atol=ATOL)


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
    mod = small_cnn()
    inputs = random_inputs(mod)
    (expected,) = run_vm(mod, *inputs)
    np.testing.assert_allclose(aicf_tvm.compile(mod, target=CUDA)(*inputs), expected, rtol=RTOL, atol=1e-5)


@pytest.mark.parametrize("name", ["squeezenet", "resnet50"])
def test_light_onnx_model_matches_onnxruntime(name):
    ort = pytest.importorskip("onnxruntime")
    path = light_model_path(name)
    mod = aicf_tvm.from_onnx(path)
    inputs = random_inputs(mod)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {p.name: a for p, a in zip(mod["main"].params, inputs)}
    (expected,) = session.run(None, feeds)
    out = aicf_tvm.compile(mod, target=CUDA)(*inputs)
    scale = float(np.abs(expected).max()) or 1.0
    np.testing.assert_allclose(out.reshape(expected.shape), expected, rtol=RTOL, atol=ATOL * scale)
