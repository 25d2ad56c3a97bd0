"""LowerEmits and the module boundary: contracts and ABI facts on the built PrimFuncs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.script import ir as I
from tvm.script import relax as R

import aicf_tvm
from aicf_tvm import Emit
from aicf_tvm.driver.models import BUILTIN_MODELS
from relax_passes import LiftEmits, PropagateContracts
from relax_passes.lower_emits import bind_scalar_ports

from ..conftest import run_vm
from .helpers import assert_same_values, special_floats

ROOT = Path(__file__).resolve().parents[2]

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
    want_of = lambda a: run_vm(ScaledGelu, np.ascontiguousarray(a))[0]

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


@I.ir_module
class ScalarMaxima:
    @R.function
    def main(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")):
        with R.dataflow():
            a = R.maximum(x, R.const(0.0, "float32"))
            b = R.maximum(y, R.const(-0.0, "float32"))
            c = R.maximum(x, R.const(np.float32("nan")))
            d = R.maximum(y, R.const(np.float32("nan")))
            R.output(a, b, c, d)
        return (a, b, c, d)


def test_scalar_specializations_are_keyed_bit_for_bit():
    """max(y, -0.0) is not max(x, 0.0) (0.0 == -0.0 in Python); two calls with the same NaN
    share one specialization (NaN != NaN in Python)."""
    bound = bind_scalar_ports(PropagateContracts()(LiftEmits()(ScalarMaxima)))
    scalars = [f for _, f in bound.functions_items()
               if isinstance(f, relax.Function) and f.attrs is not None and "aicf.scalar_ports" in f.attrs]
    assert len(scalars) == 3
    rng = np.random.default_rng(0)
    x, y = special_floats(rng, 16), special_floats(rng, 16)[::-1].copy()
    for got, want in zip(run_vm(bound, x, y), run_vm(ScalarMaxima, x, y)):
        assert_same_values(got, want)


@I.ir_module
class ManyScales:
    """One Emit (x * s + 1) called with six scales, as a QDQ model's layers each have theirs."""

    @R.function
    def main(x: R.Tensor((16,), "float32")):
        with R.dataflow():
            one = R.const(1.0, "float32")
            a = R.add(R.multiply(x, R.const(0.5, "float32")), one)
            b = R.add(R.multiply(x, R.const(0.25, "float32")), one)
            c = R.add(R.multiply(x, R.const(3.0, "float32")), one)
            d = R.add(R.multiply(x, R.const(-2.0, "float32")), one)
            e = R.add(R.multiply(x, R.const(0.125, "float32")), one)
            f = R.add(R.multiply(x, R.const(7.0, "float32")), one)
            R.output(a, b, c, d, e, f)
        return (a, b, c, d, e, f)


def test_an_emit_called_with_many_constants_shares_one_kernel():
    """Past MAX_SPECIALIZATIONS sets of constants an Emit is not specialized: its calls pass
    the constants as buffers to one kernel, with the same values."""
    bound = bind_scalar_ports(PropagateContracts()(LiftEmits()(ManyScales)))
    assert not any(isinstance(f, relax.Function) and f.attrs is not None and "aicf.scalar_ports" in f.attrs
                   for _, f in bound.functions_items())
    compiled = aicf_tvm.compile(ManyScales, target=TARGET, cache=False)
    assert len({k.name for k in compiled.kernels}) < len(compiled.kernels)
    x = special_floats(np.random.default_rng(3), 16)
    for got, want in zip(compiled(x), run_vm(ManyScales, x)):
        assert_same_values(got, want)


@I.ir_module
class SignedMaxReciprocals:
    @R.function
    def main(x: R.Tensor((16,), "float32"), y: R.Tensor((16,), "float32")):
        with R.dataflow():
            one = R.const(1.0, "float32")
            a = R.divide(one, R.maximum(x, R.const(0.0, "float32")))
            b = R.divide(one, R.maximum(y, R.const(-0.0, "float32")))  # the same Emit as a's
            R.output(a, b)
        return (a, b)


def test_signed_zero_scalars_compile_to_their_own_kernels():
    compiled = aicf_tvm.compile(SignedMaxReciprocals, target=TARGET)
    rng = np.random.default_rng(1)
    x = np.concatenate([[-0.0, 0.0, -1.0, 1.0], rng.standard_normal(12)]).astype("float32")
    y = np.concatenate([[-0.0, 0.0, -1.0, 1.0], rng.standard_normal(12)]).astype("float32")
    for got, want in zip(compiled(x, y), run_vm(SignedMaxReciprocals, x, y)):
        assert_same_values(got, want)


ZERO_SCALARS = """
import sys
import numpy as np
from tvm.script import ir as I
from tvm.script import relax as R
import aicf_tvm


@I.ir_module
class ZeroScalars:
    @R.function
    def main(x: R.Tensor((16,), "float32")):
        with R.dataflow():
            zero, one = R.const(0.0, "float32"), R.const(1.0, "float32")
            a = R.divide(one, R.multiply(x, zero))  # x * 0.0 is not 0: inf * 0 is NaN
            b = R.divide(one, R.multiply(zero, x))
            c = R.divide(zero, x)  # 0 / 0 is NaN
            d = R.divide(one, R.add(x, zero))  # -0.0 + 0.0 is +0.0
            e = R.divide(one, R.subtract(x, R.const(-0.0, "float32")))
            f = R.multiply(R.add(x, R.const(2.0, "float32")), R.const(0.5, "float32"))
            R.output(a, b, c, d, e, f)
        return (a, b, c, d, e, f)


compiled = aicf_tvm.compile(ZeroScalars, target={"kind": "llvm", "num-cores": 2})
scripts = "".join(compiled.lowered[k.name].script() for k in compiled.kernels)
assert "T.float32(2.0)" in scripts and "T.float32(0.5)" in scripts, "non-zero scalars stay immediates"
x = np.load(sys.argv[1])
np.savez(sys.argv[2], *compiled(x))
"""


def test_zero_scalars_never_fold_or_abort(tmp_path):
    """1 / (x * 0.0) used to abort the process inside TVM (a schedule inlined the folded
    0.0 into 1 / _): compiled in a subprocess, every result matches numpy on ±0, ±inf, NaN."""
    script, inputs, outputs = tmp_path / "zero_scalars.py", tmp_path / "x.npy", tmp_path / "out.npz"
    script.write_text(ZERO_SCALARS)
    x = special_floats(np.random.default_rng(2), 16)
    np.save(inputs, x)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, str(script), str(inputs), str(outputs)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    got = np.load(outputs)
    z, one = np.float32(0.0), np.float32(1.0)
    with np.errstate(all="ignore"):
        want = [one / (x * z), one / (z * x), z / x, one / (x + z), one / (x - -z),
                (x + np.float32(2)) * np.float32(0.5)]
    for k, w in enumerate(want):
        assert_same_values(got[f"arr_{k}"], w)


def _scan_over_seq(op: str, **attrs) -> tvm.IRModule:
    seq = tirx.Var("seq", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, seq, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(getattr(relax.op, op)(x, axis=1, **attrs))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("op, attrs, reference", [
    ("cumsum", {}, lambda a: np.cumsum(a, axis=1)),
    ("cumsum", {"exclusive": True}, lambda a: np.cumsum(a, axis=1) - a),
    ("cumprod", {}, lambda a: np.cumprod(a, axis=1)),
    ("cumprod", {"exclusive": True, "dtype": "float64"},
     lambda a: np.cumprod(np.concatenate([np.ones_like(a[:, :1]), a[:, :-1]], axis=1), axis=1, dtype="float64")),
    ("sort", {}, lambda a: np.sort(a, axis=1)),
], ids=["cumsum", "cumsum-exclusive", "cumprod", "cumprod-exclusive-f64", "sort"])
def test_scan_along_a_symbolic_dim_compiles_and_matches(op, attrs, reference):
    """TOPI's scan and sort kernels declare buffers with Python's decl_buffer, whose default
    layout names the shape's variables; FuseTIR remapped the shape but not the layout,
    and the kernel was left with an undefined ``seq``."""
    mod = _scan_over_seq(op, **attrs)
    compiled = aicf_tvm.compile(mod, target=TARGET)
    rng = np.random.default_rng(11)
    for length in (1, 6):
        data = rng.uniform(0.5, 1.5, (3, length, 4)).astype("float32")
        got = np.asarray(compiled(data))
        np.testing.assert_array_equal(got, run_vm(mod, data)[0])
        np.testing.assert_allclose(got, reference(data.astype("float64")), rtol=1e-6)
