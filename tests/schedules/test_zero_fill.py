"""A fresh buffer's zeroing as one flat loop (``schedules.cpu.zero_fill``).

The structural cases run the rewrite on hand-written lowered TIR: a nest that stores +0.0
into every element of a buffer just allocated becomes one loop; a nest that zeroes a
parameter, a buffer not just allocated, fewer elements than the buffer has, -0.0 or
another value, or reads as well as stores, is left as it is. The build cases run kernels
through our TIR pipeline and TVM's, and a GEMM model against PyTorch.
"""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import tirx
from tvm.script import tirx as T

import aicf_tvm
from schedules.cpu.parallel_guard import tir_pipeline
from schedules.cpu.zero_fill import flat_zero_fill

torch = pytest.importorskip("torch")


@T.prim_func
def tiled_zeroing(a: T.Buffer((8, 32), "float32"), out: T.Buffer((8, 32), "float32")):
    for task in T.parallel(2):
        acc = T.alloc_buffer((128,), "float32")  # fresh, zeroed by a 2 x 4 nest of 16 stores
        for i in range(2):
            for j in range(4):
                base: T.let[T.int32] = i * 64 + j * 4
                acc[base] = T.float32(0)
                acc[base + 1] = T.float32(0)
                acc[base + 2] = T.float32(0)
                acc[base + 3] = T.float32(0)
                acc[base + 16] = T.float32(0)
                acc[base + 17] = T.float32(0)
                acc[base + 18] = T.float32(0)
                acc[base + 19] = T.float32(0)
                acc[base + 32] = T.float32(0)
                acc[base + 33] = T.float32(0)
                acc[base + 34] = T.float32(0)
                acc[base + 35] = T.float32(0)
                acc[base + 48] = T.float32(0)
                acc[base + 49] = T.float32(0)
                acc[base + 50] = T.float32(0)
                acc[base + 51] = T.float32(0)
        for r, c in T.grid(8, 16):
            acc[r * 16 + c] = acc[r * 16 + c] + a[r, task * 16 + c] * T.float32(3)
        for r, c in T.grid(8, 16):
            out[r, task * 16 + c] = acc[r * 16 + c]


@T.prim_func
def half_zeroed(a: T.Buffer((128,), "float32"), out: T.Buffer((128,), "float32")):
    acc = T.alloc_buffer((128,), "float32")
    for k in range(64):  # half the buffer
        acc[k] = T.float32(0)
    for k in range(128):
        out[k] = acc[k % 64] + a[k]


@T.prim_func
def minus_zero(a: T.Buffer((128,), "float32"), out: T.Buffer((128,), "float32")):
    acc = T.alloc_buffer((128,), "float32")
    for k in range(128):  # -0.0 is not every bit clear
        acc[k] = T.float32(-0.0)
    for k in range(128):
        out[k] = acc[k] + a[k]


@T.prim_func
def ones(a: T.Buffer((128,), "float32"), out: T.Buffer((128,), "float32")):
    acc = T.alloc_buffer((128,), "float32")
    for k in range(128):
        acc[k] = T.float32(1)
    for k in range(128):
        out[k] = acc[k] + a[k]


@T.prim_func
def reads(a: T.Buffer((128,), "float32"), out: T.Buffer((128,), "float32")):
    acc = T.alloc_buffer((128,), "float32")
    for k in range(128):  # a read (and NaN * 0 is NaN)
        acc[k] = a[k] * T.float32(0)
    for k in range(128):
        out[k] = acc[k] + a[k]


@T.prim_func
def parallel_zeroing(a: T.Buffer((128,), "float32"), out: T.Buffer((128,), "float32")):
    acc = T.alloc_buffer((128,), "float32")
    for k in T.parallel(128):
        acc[k] = T.float32(0)
    for k in range(128):
        out[k] = acc[k] + a[k]


@T.prim_func
def not_at_once(a: T.Buffer((128,), "float32"), out: T.Buffer((128,), "float32")):
    acc = T.alloc_buffer((128,), "float32")
    out[0] = T.float32(0)
    for k in range(128):
        acc[k] = T.float32(0)
    for k in range(128):
        out[k] = acc[k] + a[k]


def _fill_loops(func: tirx.PrimFunc) -> list[tirx.For]:
    found: list[tirx.For] = []
    tvm_ffi.structural_walk(func.body, [(tirx.For, lambda f: f.loop_var.name == "zero_fill" and found.append(f))])
    return found


def test_a_fresh_buffers_zeroing_nest_becomes_one_loop():
    out = flat_zero_fill(tiled_zeroing)
    fills = _fill_loops(out)
    assert len(fills) == 1 and int(fills[0].extent) == 128
    assert isinstance(fills[0].body, tirx.BufferStore) and fills[0].body.buffer.name == "acc"
    assert flat_zero_fill(out).same_as(out) or tvm_ffi.structural_equal(flat_zero_fill(out), out)  # a fixpoint


@pytest.mark.parametrize("func", [half_zeroed, minus_zero, ones, reads, parallel_zeroing, not_at_once])
def test_other_nests_are_left_alone(func):
    assert tvm_ffi.structural_equal(flat_zero_fill(func), func)


def test_a_parameter_is_not_fresh():
    @T.prim_func
    def zero_param(out: T.Buffer((128,), "float32")):
        for k in range(128):
            out[k] = T.float32(0)

    assert tvm_ffi.structural_equal(flat_zero_fill(zero_param), zero_param)


def _run(func: tirx.PrimFunc, pipeline: str, *arrays: np.ndarray) -> np.ndarray:
    lib = tvm.tirx.build(func, target="llvm", pipeline=pipeline)
    tensors = [tvm.runtime.tensor(a) for a in arrays]
    lib(*tensors)
    return tensors[-1].numpy()


def test_the_kernel_computes_what_it_did():
    a = np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32)
    a[0, 0], a[1, 5] = -0.0, np.nan
    ours = _run(tiled_zeroing, tir_pipeline(), a, np.full((8, 32), 7, np.float32))
    tvms = _run(tiled_zeroing, "default", a, np.full((8, 32), 7, np.float32))
    np.testing.assert_array_equal(ours.view(np.uint32), tvms.view(np.uint32))
    np.testing.assert_array_equal(ours, np.float32(0) + a * np.float32(3))
    assert np.signbit(ours[0, 0]) == np.signbit(np.float32(0) + np.float32(-0.0) * 3)


def test_a_gemm_models_zeroing_is_one_loop_and_its_output_pytorchs(monkeypatch):
    """A GEMM whose C chunk ``decompose_reduction`` zeroes under the register tile's loops
    (the nest LLVM took seconds over): one flat loop in the build, the output PyTorch's."""
    from schedules.cpu import zero_fill

    rewritten = []

    def recording(func: tirx.PrimFunc) -> tirx.PrimFunc:
        out = flat_zero_fill(func)
        rewritten.extend(_fill_loops(out))
        return out

    monkeypatch.setattr(zero_fill, "flat_zero_fill", recording)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).eval()
    x = torch.randn(1, 128, 256)
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(model, (x,)), target="llvm", cache=False)
    assert rewritten
    outs = []
    for inp in (x, x * -0.5 + 1):
        with torch.no_grad():
            ref = model(inp).numpy()
        outs.append(np.asarray(compiled(inp.numpy())))
        np.testing.assert_allclose(outs[-1], ref, rtol=1e-4, atol=1e-4)
    assert not np.array_equal(outs[0], outs[1])
