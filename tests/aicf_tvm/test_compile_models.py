"""Every light ONNX model and both built-in models compile through aicf_tvm.compile and
match ONNX Runtime; the built-in models take strictly fewer kernels than TVM's pipeline."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import aicf_tvm
from aicf_tvm.models import BUILTIN_MODELS
from aicf_tvm.models_onnx import to_onnx
from aicf_tvm.targets import resolve_target

from ..conftest import LIGHT_MODELS, light_model_path, random_inputs

TARGET = {"kind": "llvm", "num-cores": 2}


def ort_run(model, args: list[np.ndarray]) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    sess = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), args)})[0]


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_matches_onnxruntime(name):
    path = str(light_model_path(name))
    mod = aicf_tvm.from_onnx(path)
    compiled = aicf_tvm.compile(mod, target=TARGET)
    args = random_inputs(mod, seed=1)
    np.testing.assert_allclose(compiled(*args), ort_run(path, args), rtol=1e-4, atol=1e-5)
    assert compiled.report.accepted, "nothing was fused"


@pytest.mark.parametrize("name", ["encoder_layer", "decoder_block"])
def test_builtin_model_matches_onnxruntime(name):
    mod = BUILTIN_MODELS[name]()
    compiled = aicf_tvm.compile(mod, target=TARGET)
    args = random_inputs(mod, seed=2)
    np.testing.assert_allclose(compiled(*args), ort_run(to_onnx(name), args), rtol=1e-4, atol=1e-5)
    kinds = {k.kind for k in compiled.kernels}
    assert "fused_attention" in kinds and "fused_gemm_bias_act" in kinds


@pytest.mark.parametrize("name", ["encoder_layer_small", "decoder_block_small"])
def test_fewer_kernels_than_tvm(name):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from kernel_count import our_kernels, tvm_kernels

    mod, target = BUILTIN_MODELS[name](), resolve_target(TARGET)
    ours, theirs = our_kernels(mod, target), tvm_kernels(mod, target)
    assert len(ours) < len(theirs), (ours, theirs)
    assert sum(k.startswith("fused_attention") for k in ours) == 1  # q·kᵀ, softmax, ·v: one kernel
