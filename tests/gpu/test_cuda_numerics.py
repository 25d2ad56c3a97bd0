"""CUDA correctness of the ONNX light models on a GPU: ``aicf_tvm.compile(target="cuda")``
outputs against ONNX Runtime, on a host with the whole stack (compiler included).

Skipped where TVM sees no CUDA device (every CI machine). The built-in encoder layer and
decoder block, a convnet and the Adam step are checked on a GPU host that has only TVM's
runtime by the device-check bundle (``scripts/gpu_bundle.py``, README "Deploying").
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm

import aicf_tvm
from tests.conftest import light_model_path, random_inputs

pytestmark = pytest.mark.skipif(not tvm.cuda(0).exist, reason="no CUDA device")

CUDA = {"kind": "cuda", "arch": "sm_90"}
# float32 on the GPU (other summation orders, fast math intrinsics) vs ONNX Runtime on the CPU
RTOL, ATOL = 2e-3, 2e-3


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
