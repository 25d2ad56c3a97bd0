"""Every built-in model and four light ONNX models (with the random weights of
``tests.helpers.light_model``, as the numeric tests use) compile for CUDA (sm_90)
through ``aicf_tvm.compile``: every PrimFunc gets a thread-bound GPU schedule and the built
executable carries a CUDA module with one ``__global__`` kernel or more.

Compile only (this machine has nvcc, no GPU); the device-check bundle
(``scripts/gpu_bundle.py``) checks the numbers on a GPU.
The other light models (densenet121, inception_v1/v2, shufflenet, vgg19) take
25-170 s each here: ``python -m scripts.cuda_compile_all`` covers them all.
"""

from __future__ import annotations

import shutil

import pytest

import aicf_tvm
from aicf_tvm.driver.models import BUILTIN_MODELS
from tests.helpers import cuda_source, light_model

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")

CUDA = {"kind": "cuda", "arch": "sm_90"}


def cuda_kernel_count(executable) -> int:
    """``__global__`` kernels in the CUDA module the executable imports (0: no CUDA module)."""
    return (cuda_source(executable) or "").count("__global__")


def assert_cuda_build(compiled: aicf_tvm.CompiledModel) -> None:
    assert "gpu" in compiled.target.keys and str(compiled.target.export()["arch"]) == "sm_90"
    assert compiled.kernels and all(k.schedule for k in compiled.kernels)
    assert cuda_kernel_count(compiled.executable) >= 1


@pytest.mark.parametrize("name", sorted(BUILTIN_MODELS))
def test_builtin_model_compiles_for_cuda(name: str):
    assert_cuda_build(aicf_tvm.compile(BUILTIN_MODELS[name](), target=CUDA))


@pytest.mark.parametrize("name", ["bvlc_alexnet", "resnet50", "squeezenet", "zfnet512"])
def test_light_onnx_model_compiles_for_cuda(name: str):
    compiled = aicf_tvm.compile(aicf_tvm.from_onnx(light_model(name)), target=CUDA)
    assert_cuda_build(compiled)
    assert compiled.report.accepted  # our fusion ran: the kernels are fused Emits, not TVM's
