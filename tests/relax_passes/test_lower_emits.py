"""LowerEmits and the module boundary: contracts and ABI facts on the built PrimFuncs."""

from __future__ import annotations

import numpy as np
from tvm.script import ir as I
from tvm.script import relax as R

import aicf_tvm
from aicf_tvm import Emit
from aicf_tvm.models import BUILTIN_MODELS

from ..conftest import run_vm

TARGET = {"kind": "llvm", "num-cores": 2}


@I.ir_module
class ScaledGelu:
    @R.function
    def main(x: R.Tensor((16, 32), "float32")):
        with R.dataflow():
            y = R.multiply(x, R.const(0.5, "float32"))
            z = R.nn.gelu(y)
            R.output(z)
        return z


def test_every_kernel_carries_its_emit_and_abi():
    compiled = aicf_tvm.compile(BUILTIN_MODELS["encoder_layer_small"](), target=TARGET)
    for kernel in compiled.kernels:
        func = compiled.lowered[kernel.name]
        emit = Emit.from_attr(func.attrs["aicf.emit"])
        assert emit.kind == kernel.kind == str(func.attrs["aicf.kind"])
        abi = func.attrs["aicf.abi"]
        buffers = [e for e in abi if not e.get("scalar", False)]
        assert len(buffers) == len(func.params)
        for entry, param in zip(buffers, func.params):
            assert int(entry["align"]) == param.ty.data_alignment == 64  # what the kernel assumes
            # every buffer starts its allocation: offset 0, stronger than any offset_factor
            assert int(param.ty.elem_offset) == 0


def test_rank0_constant_is_a_scalar_immediate_not_a_buffer():
    """The attention's 1/sqrt(d) is a rank-0 constant: the kernel gets it as an
    immediate (no rank-0 buffer parameter) and the port is marked scalar."""
    compiled = aicf_tvm.compile(BUILTIN_MODELS["encoder_layer_small"](), target=TARGET)
    [attn] = [k for k in compiled.kernels if k.kind == "fused_attention"]
    func = compiled.lowered[attn.name]
    assert all(len(p.ty.shape) > 0 for p in func.params)
    assert {"port": "scale", "scalar": True} in [dict(e) for e in func.attrs["aicf.abi"]]
    emit = Emit.from_attr(func.attrs["aicf.emit"])
    assert bool(emit.contract.provides.port("scale").abi.scalar_view)
    assert "T.float32(0.25)" in func.script(), "the scale is not an immediate in the kernel"


def test_external_input_proven_align1_is_checked_at_the_boundary():
    compiled = aicf_tvm.compile(ScaledGelu, target=TARGET)
    [kernel] = compiled.kernels
    entries = [dict(e) for e in compiled.lowered[kernel.name].attrs["aicf.abi"]]
    x_entry = next(e for e in entries if e["port"] == "x" or e["port"].startswith("in"))
    assert x_entry["proven"] == 1 and x_entry["align"] == 64 and x_entry["boundary_check"]
    out_entry = next(e for e in entries if e["port"] == "out")
    assert out_entry["proven"] == 64 and not out_entry["boundary_check"]


def test_boundary_copies_only_inputs_that_break_the_abi():
    compiled = aicf_tvm.compile(ScaledGelu, target=TARGET)
    rng = np.random.default_rng(0)
    want_of = lambda a: run_vm(ScaledGelu, np.ascontiguousarray(a))[0]  # noqa: E731

    raw = np.empty(16 * 32 + 16, dtype="float32")
    base = (-raw.ctypes.data % 64) // 4
    aligned = raw[base: base + 16 * 32].reshape(16, 32)
    aligned[...] = rng.standard_normal((16, 32))
    np.testing.assert_allclose(compiled(aligned), want_of(aligned), rtol=1e-6)
    assert compiled.boundary_copies == []  # zero-copy

    misaligned = raw[base + 1: base + 1 + 16 * 32].reshape(16, 32)
    np.testing.assert_allclose(compiled(misaligned), want_of(misaligned), rtol=1e-6)
    assert compiled.boundary_copies == ["x"]

    strided = np.asarray(rng.standard_normal((32, 16)), dtype="float32").T
    np.testing.assert_allclose(compiled(strided), want_of(strided), rtol=1e-6)
    assert compiled.boundary_copies == ["x"]
