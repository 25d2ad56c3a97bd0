"""CUDA kernels travel compiled (``aicf_tvm.runtime.cuda_binary``), and every kernel of a
GPU build runs on the GPU.

A CUDA build on this machine (nvcc, no GPU) exports its kernels as TVM's source module;
ours carries the nvcc fatbin of that source in it, so that a host with TVM's runtime only
loads it (checked on an H200 by ``scripts/gpu_bundle.py``). The compile hook that
``aicf_tvm.load`` installs returns that fatbin and passes any other source on.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
import tvm

import aicf_tvm
from aicf_tvm.core.errors import UnsupportedModelError
from aicf_tvm.core.kinds.adam import fused_adam_kernel
from aicf_tvm.driver.models import BUILTIN_MODELS
from aicf_tvm.driver.optimizer import adam_function, compile_optimizer_step
from aicf_tvm.driver.pipeline import build
from aicf_tvm.runtime import cuda_binary
from schedules.cuda import host_bound_kernels
from tests.helpers import cuda_source

CUDA = {"kind": "cuda", "arch": "sm_90"}
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
ADAM = dict(lr=1e-3, beta1=0.9, beta2=0.999, one_minus_beta1=0.1, one_minus_beta2=0.001, eps=1e-8,
            weight_decay=0.0)


@needs_nvcc
def test_cuda_build_carries_the_fatbin_of_every_kernel():
    compiled = aicf_tvm.compile(BUILTIN_MODELS["encoder_layer_small"](), target=CUDA)
    source = cuda_source(compiled.executable)
    fatbin = cuda_binary.carried_fatbin(source)
    assert fatbin is not None and fatbin.startswith(cuda_binary.FATBIN_MAGIC)
    kernels = re.findall(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(', source)
    assert kernels
    for name in kernels:  # each kernel's symbol is in the machine code / PTX nvcc wrote
        assert name.encode() in fatbin, name
    assert source.index("__global__") < source.rindex(cuda_binary.MARK)  # the source stays first


def test_damaged_fatbin_comment_is_refused():
    blob = cuda_binary.FATBIN_MAGIC + bytes(range(200))
    source = cuda_binary.with_fatbin("extern \"C\" __global__ void k() {}", blob)
    assert cuda_binary.carried_fatbin(source) == blob
    assert cuda_binary.carried_fatbin("__global__ void k() {}") is None
    with pytest.raises(cuda_binary.CarriedBinaryError, match="truncated"):
        cuda_binary.carried_fatbin(source[: len(source) - 10])
    with pytest.raises(cuda_binary.CarriedBinaryError, match="base64"):
        cuda_binary.carried_fatbin(source.replace(source.split("\n")[-3][:4], "!!!!", 1))
    with pytest.raises(cuda_binary.CarriedBinaryError, match="not a fatbin"):
        cuda_binary.carried_fatbin(cuda_binary.with_fatbin("k", b"\x7fELF" + bytes(100)))


def test_compile_hook_returns_the_carried_fatbin_and_passes_other_sources_on():
    # in a child: the hook is installed once per process, over whatever hook was there
    script = """
import tvm_ffi
from aicf_tvm.runtime import cuda_binary
tvm_ffi.register_global_func(cuda_binary.COMPILE_HOOK, lambda src: b"previous:" + src.encode(), override=True)
cuda_binary.install_hook()
cuda_binary.install_hook()  # idempotent: does not wrap itself
hook = tvm_ffi.get_global_func(cuda_binary.COMPILE_HOOK)
blob = cuda_binary.FATBIN_MAGIC + b"kernels"
print(bytes(hook(cuda_binary.with_fatbin("source", blob))) == blob, bytes(hook("plain")))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "b'previous:plain'"]


@needs_nvcc
def test_optimizer_step_for_cuda_binds_every_kernel_to_gpu_threads():
    step = compile_optimizer_step(adam_function([(300, 7), (5,)]), target=CUDA)
    assert host_bound_kernels(step.lowered) == []
    assert "fused_adam_step" in [gv.name_hint for gv in step.lowered.get_global_vars()]
    assert "fused_adam_step" in cuda_source(step.executable)


def test_gpu_build_refuses_a_kernel_that_would_run_on_the_host():
    cpu_kernel = fused_adam_kernel([(64,)], "float32", ADAM)
    gpu_kernel = fused_adam_kernel([(64,)], "float32", ADAM, gpu=True)
    assert host_bound_kernels(tvm.IRModule({"k": cpu_kernel})) == ["k"]
    assert host_bound_kernels(tvm.IRModule({"k": gpu_kernel})) == []
    with pytest.raises(UnsupportedModelError, match="k.*no GPU schedule"):
        build(tvm.IRModule({"k": cpu_kernel}), tvm.target.Target(CUDA))
