"""The target CPU kernels are compiled for (``schedules.cpu.codegen.codegen_target``).

On x86 it keeps gathers out of LLVM's vectorizers: the row reductions of a layer norm,
stepped 8 rows together, would otherwise be packed into strided ``vgatherdps`` loads.
"""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.target import Target, codegen

import aicf_tvm
from schedules.cpu.codegen import NO_GATHER, codegen_target

X86 = str(codegen.llvm_get_system_triple()).startswith(("x86_64", "i686"))
# compiled, not run: LLVM's Zen 5 cost model packs the interleaved rows into gathers
ZEN5 = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver5", "num-cores": 2}


def mattr(target: Target) -> list[str]:
    return [str(f) for f in target.export().get("mattr", [])]


def test_x86_targets_prefer_no_gather():
    target = codegen_target(Target(ZEN5))
    assert NO_GATHER in mattr(target)
    assert target.export()["mcpu"] == "znver5"  # the rest of the target is kept
    assert codegen_target(target).export() == target.export()  # idempotent


def test_other_targets_are_left_alone():
    arm = Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-v1"})
    assert NO_GATHER not in mattr(codegen_target(arm))
    stated = Target({**ZEN5, "mattr": ["-prefer-no-gather"]})  # a user's own choice wins
    assert mattr(codegen_target(stated)) == ["-prefer-no-gather"]
    cuda = Target({"kind": "cuda", "arch": "sm_90"})
    assert codegen_target(cuda).same_as(cuda)


def layer_norm_module(rows: int, width: int, gamma: np.ndarray, beta: np.ndarray) -> tvm.IRModule:
    """Residual add then layer norm over the last axis (BERT's, 128 rows of 768)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, rows, width), "float32"))
    r = relax.Var("r", relax.TensorType((1, rows, width), "float32"))
    with bb.function("main", [x, r]):
        with bb.dataflow():
            added = bb.emit(relax.op.add(x, r))
            out = bb.emit_output(relax.op.nn.layer_norm(added, relax.const(gamma), relax.const(beta), axes=[-1]))
        bb.emit_func_output(out)
    return bb.get()


def kernel_asm(compiled) -> str:
    return "".join(m.inspect_source("asm") for m in compiled.executable.mod.imports if m.kind == "llvm")


@pytest.mark.skipif(not X86, reason="gathers are an x86 instruction")
def test_compiled_row_norm_has_no_gathers():
    rng = np.random.default_rng(0)
    gamma, beta = rng.standard_normal(768).astype("float32"), rng.standard_normal(768).astype("float32")
    mod = layer_norm_module(128, 768, gamma, beta)
    assert "vgather" not in kernel_asm(aicf_tvm.compile(mod, target=ZEN5))
    # and what the host runs is the layer norm (float64 numpy reference)
    x, r = (rng.standard_normal((1, 128, 768)).astype("float32") for _ in range(2))
    out = aicf_tvm.compile(mod, target="llvm")(x, r)
    out = out.numpy() if hasattr(out, "numpy") else np.asarray(out)
    y = x.astype("float64") + r
    mean, var = y.mean(-1, keepdims=True), y.var(-1, keepdims=True)
    np.testing.assert_allclose(out, (y - mean) / np.sqrt(var + 1e-5) * gamma + beta, rtol=1e-4, atol=1e-5)
