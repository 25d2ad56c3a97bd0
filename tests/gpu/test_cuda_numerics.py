"""CUDA correctness of the ONNX light models on a GPU: ``aicf_tvm.compile(target="cuda")``
outputs against ONNX Runtime (random weights), on a host with the whole stack.

Skipped where TVM sees no CUDA device (every CI machine). The built-in encoder layer and
decoder block, a convnet and the Adam step are checked on a GPU host that has only TVM's
runtime by the device-check bundle (``scripts/gpu_bundle.py``, README "Deploying").
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm

import aicf_tvm
from tests.conftest import random_inputs
from tests.helpers import assert_input_sensitive, light_model, ort_function

pytestmark = pytest.mark.skipif(not tvm.cuda(0).exist, reason="no CUDA device")

CUDA = {"kind": "cuda", "arch": "sm_90"}
# float32 on the GPU (other summation orders, fast math intrinsics) vs ONNX Runtime on the CPU
RTOL, ATOL = 2e-3, 2e-3


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
