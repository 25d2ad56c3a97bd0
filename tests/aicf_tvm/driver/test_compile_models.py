"""Every light ONNX model and both built-in models compile through aicf_tvm.compile and
match ONNX Runtime; the built-in models take strictly fewer kernels than TVM's pipeline.

The light models get seeded random weights (the onnx wheel's are all 0.02, which gives
the same output for every input), and each comparison first checks that two different
inputs give different reference outputs."""

from __future__ import annotations

import pytest

import aicf_tvm
from aicf_tvm.driver.models import BUILTIN_MODELS
from aicf_tvm.driver.models_onnx import to_onnx
from aicf_tvm.runtime.targets import resolve_target

from ...conftest import LIGHT_MODELS, random_inputs
from ...helpers import assert_matches_reference, light_model, ort_function

TARGET = {"kind": "llvm", "num-cores": 2}


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_matches_onnxruntime(name):
    model = light_model(name)
    mod = aicf_tvm.from_onnx(model)
    reference = ort_function(model)
    del model  # vgg19's weights are 0.5 GB; ONNX Runtime and TVM each hold their own
    compiled = aicf_tvm.compile(mod, target=TARGET)
    inputs = [random_inputs(mod, seed=s) for s in (1, 2)]
    assert_matches_reference(compiled, reference, inputs, rtol=1e-4, atol=1e-5)
    assert compiled.report.accepted, "nothing was fused"


@pytest.mark.parametrize("name", ["encoder_layer", "decoder_block"])
def test_builtin_model_matches_onnxruntime(name):
    mod = BUILTIN_MODELS[name]()
    compiled = aicf_tvm.compile(mod, target=TARGET)
    inputs = [random_inputs(mod, seed=s) for s in (2, 3)]
    assert_matches_reference(compiled, ort_function(to_onnx(name)), inputs, rtol=1e-4, atol=1e-5)
    kinds = {k.kind for k in compiled.kernels}
    assert "fused_attention" in kinds and "fused_gemm_bias_act" in kinds


@pytest.mark.parametrize("name", ["encoder_layer_small", "decoder_block_small"])
def test_fewer_kernels_than_tvm(name):
    from scripts.kernel_count import our_kernels, tvm_kernels

    mod, target = BUILTIN_MODELS[name](), resolve_target(TARGET)
    ours, theirs = our_kernels(mod, target), tvm_kernels(mod, target)
    assert len(ours) < len(theirs), (ours, theirs)
    assert sum(k.startswith("fused_attention") for k in ours) == 1  # q·kᵀ, softmax, ·v: one kernel
