"""MaterializeEmits and pre-packed weights: insert the Emit a refused candidate needs
when the cost model says so; pack constant GEMM operands at compile time."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

import aicf_tvm
from aicf_tvm.core.candidate import Candidate, port_requirement
from aicf_tvm.core.lattice import ShapeFact
from aicf_tvm.core.report import FusionReport
from aicf_tvm.driver.pipeline import normalize, optimize
from aicf_tvm.library import DEFAULT_CANDIDATES
from aicf_tvm.library.gemm import gemm_variants
from relax_passes import LowerEmits
from relax_passes.lower_emits import kernel_calls
from schedules.prepack_weights import mark_layout_free

from ..conftest import run_vm

TARGET = {"kind": "llvm", "num-cores": 2}


def _contiguous_a(m):
    return port_requirement(a=ShapeFact.contiguous(m.shapes["a"].dims))


# a GEMM kernel that reads A as a row-major buffer: the lattice states it as a requirement
PACKED_GEMM = Candidate("fused_gemm_bias_act", gemm_variants, requires=_contiguous_a, label="packed_gemm",
                        priority=50)
WITH_PACKED_GEMM = [PACKED_GEMM, *(c for c in DEFAULT_CANDIDATES if c.kind != "fused_gemm_bias_act")]


def transposed_operand(k: int):
    """(xᵀ @ w + b) with x [k, 8]: A reaches the GEMM as a transposed (strided) view."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((k, 8), "float32"))
    w = relax.Var("w", relax.TensorType((k, 16), "float32"))
    b = relax.Var("b", relax.TensorType((16,), "float32"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            xt = bb.emit(relax.op.permute_dims(x, [1, 0]))
            z = bb.emit_output(relax.op.add(relax.op.matmul(xt, w), b))
        bb.emit_func_output(z)
    return bb.get()


def _decisions(compiled, name):
    return [d for d in compiled.report.decisions if d.candidate == name]


def test_contiguous_copy_is_materialized_when_insert_and_fuse_wins():
    """A transposed view fails packed_gemm's contiguity requirement on A; a copy costs
    2 x 1 KiB, the fusion saves 4.5 KiB: inserted, the candidate fuses, and the copy
    runs inside the transpose kernel (two kernels, as without the insert)."""
    compiled = aicf_tvm.compile(transposed_operand(32), target=TARGET, candidates=WITH_PACKED_GEMM)
    [decision] = _decisions(compiled, "materialize:contiguous")
    assert decision.accepted
    assert "a [8x32] strides(1,8) -> contiguous copy; cost 2048 B < benefit 4608 B" in decision.note
    assert any(d.accepted for d in _decisions(compiled, "packed_gemm"))
    assert [k.kind for k in compiled.kernels] == ["fused_elementwise", "fused_gemm_bias_act"]
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype("float32") for s in ((32, 8), (32, 16), (16,)))
    np.testing.assert_allclose(compiled(x, w, b), x.T @ w + b, rtol=1e-5, atol=1e-5)


def test_contiguous_copy_is_not_materialized_when_it_costs_more():
    """A is 16 KiB: copying it (write + read 32 KiB) costs more than the fusion saves."""
    compiled = aicf_tvm.compile(transposed_operand(512), target=TARGET, candidates=WITH_PACKED_GEMM)
    [decision] = _decisions(compiled, "materialize:contiguous")
    assert not decision.accepted and "cost 32768 B >= benefit 4608 B" in decision.note
    assert not any(d.accepted for d in _decisions(compiled, "packed_gemm"))
    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(s).astype("float32") for s in ((512, 8), (512, 16), (16,)))
    np.testing.assert_allclose(compiled(x, w, b), x.T @ w + b, rtol=1e-4, atol=1e-4)


def test_no_insert_when_the_failure_is_not_a_layout_one():
    """A rank requirement no copy can meet: refused, nothing materialized."""
    def rank3(m):
        return port_requirement(a=ShapeFact.rank(3))

    cand = Candidate("fused_gemm_bias_act", gemm_variants, requires=rank3, label="rank3_gemm", priority=50)
    compiled = aicf_tvm.compile(transposed_operand(32), target=TARGET, candidates=[cand])
    assert not [d for d in compiled.report.decisions if d.candidate.startswith("materialize:")]
    assert not any(d.accepted for d in _decisions(compiled, "rank3_gemm"))


def _lowered(mod):
    """The Emit PrimFuncs as LowerEmits leaves them, before any schedule."""
    return LowerEmits()(optimize(normalize(mod), FusionReport()))


def _gemm_module(weight_is_constant: bool, m: int = 64, k: int = 48, n: int = 96, seed: int = 0):
    """relu(x @ w + b), N the vectorized axis (the rule packs B), N not a multiple of nr."""
    rng = np.random.default_rng(seed)
    w_np = rng.standard_normal((k, n)).astype("float32")
    b_np = rng.standard_normal(n).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    params = [x]
    if weight_is_constant:
        w = relax.const(w_np)
    else:
        w = relax.Var("w", relax.TensorType((k, n), "float32"))
        params.append(w)
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.matmul(x, w), relax.const(b_np))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get(), w_np, b_np


def test_constant_weight_is_packed_at_compile_time():
    """The GEMM rule packs B into [N/nr, K, nr] blocks; for a constant B the packing is
    split out and folded: the kernel takes the packed constant, no packing runs per call."""
    mod, w, b = _gemm_module(weight_is_constant=True)
    compiled = aicf_tvm.compile(mod, target=TARGET)
    [kernel] = compiled.kernels
    assert kernel.kind == "fused_gemm_bias_act" and kernel.name.endswith("_prepacked")
    main = compiled.lowered["main"]
    assert not [n for n in kernel_calls(main) if n.endswith("_weight_prepack")]
    [call] = [bnd.value for blk in main.body.blocks for bnd in blk.bindings
              if isinstance(bnd.value, relax.Call) and bnd.value.op.name == "relax.call_tir"]
    packed = [a for a in call.args[1].fields if isinstance(a, tvm.ir.Constant) and a.ty.ndim == 4]
    assert len(packed) == 1, "the kernel does not receive a packed constant"
    s, blocks, kk, nr = (int(d) for d in packed[0].ty.shape)
    assert (s, kk) == (1, 48) and blocks * nr >= 96
    np.testing.assert_array_equal(  # the packed constant holds B: [j // nr, k, j % nr]
        packed[0].value.numpy().transpose(0, 2, 1, 3).reshape(48, blocks * nr)[:, :96], w)
    abi = [dict(e) for e in compiled.lowered[kernel.name].attrs["aicf.abi"]]
    assert any(e.get("prepacked") for e in abi)
    [decision] = _decisions(compiled, "materialize:layout_transform")
    assert decision.accepted and "[48x96] packed to" in decision.note and "at compile time" in decision.note
    x = np.random.default_rng(5).standard_normal((64, 48)).astype("float32")
    np.testing.assert_allclose(compiled(x), np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(compiled(x), run_vm(mod, x)[0], rtol=1e-5, atol=1e-5)


def test_runtime_weight_is_packed_per_call():
    """B a function input: not a constant, so the kernel keeps its own packing."""
    mod, w, b = _gemm_module(weight_is_constant=False)
    compiled = aicf_tvm.compile(mod, target=TARGET)
    [kernel] = compiled.kernels
    assert not kernel.name.endswith("_prepacked")
    assert not _decisions(compiled, "materialize:layout_transform")
    assert "layout_free_buffers" not in compiled.lowered[kernel.name].attrs
    x = np.random.default_rng(6).standard_normal((64, 48)).astype("float32")
    np.testing.assert_allclose(compiled(x, w), np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)


def test_layout_free_only_when_constant_at_every_call():
    """One kernel called with a constant B and with an input B: B is not layout-free (its
    packing stays in the kernel); the bias, constant at both calls, is."""
    mod, w_np, _ = _gemm_module(weight_is_constant=False)
    lowered = _lowered(mod)
    [name] = kernel_calls(lowered["main"])
    [call] = [bnd.value for blk in lowered["main"].body.blocks for bnd in blk.bindings
              if isinstance(bnd.value, relax.Call) and bnd.value.op.name == "relax.call_tir"]
    x_arg, w_arg, bias = call.args[1].fields
    assert isinstance(bias, tvm.ir.Constant) and not isinstance(w_arg, tvm.ir.Constant)
    gv = lowered.get_global_var(name)
    del lowered["main"]  # replaced by the two-call main below
    bb = relax.BlockBuilder(lowered)
    x = relax.Var("x", x_arg.ty)
    w = relax.Var("w", w_arg.ty)
    out_ty = call.ty
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y1 = bb.emit(relax.call_tir(gv, [x, relax.const(w_np), bias], out_ty))
            y2 = bb.emit(relax.call_tir(gv, [x, w, bias], out_ty))
            out = bb.emit_output(relax.op.add(y1, y2))
        bb.emit_func_output(out)
    both = mark_layout_free(bb.get())
    assert [int(i) for i in both[name].attrs["layout_free_buffers"]] == [2]
    only_constant = mark_layout_free(_lowered(_gemm_module(weight_is_constant=True)[0]))
    [const_name] = kernel_calls(only_constant["main"])
    assert [int(i) for i in only_constant[const_name].attrs["layout_free_buffers"]] == [1, 2]


def test_cast_of_a_constant_weight_runs_at_compile_time():
    """A float16 weight cast to float32 for the GEMM (as fp16-stored ONNX models do): the
    cast needs only the constant, so it is computed at compile time (FoldConstant before
    lifting; MaterializeEmits folds any constant-only Emit left later); per inference only
    the fused GEMM runs, on the exact float32 values of the weight."""
    rng = np.random.default_rng(3)
    w16 = rng.standard_normal((48, 96)).astype("float16")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 48), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.op.astype(relax.const(w16), "float32")
            y = bb.emit(relax.op.nn.gelu(relax.op.matmul(x, w)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    compiled = aicf_tvm.compile(mod, target=TARGET)
    assert [k.kind for k in compiled.kernels] == ["fused_gemm_bias_act"]
    main = compiled.lowered["main"]
    constants = [a for blk in main.body.blocks for bnd in blk.bindings if isinstance(bnd.value, relax.Call)
                 for a in (bnd.value.args[1].fields if bnd.value.op.name == "relax.call_tir" else [])
                 if isinstance(a, tvm.ir.Constant)]
    assert [str(c.ty.dtype) for c in constants] == ["float32"], "the kernel should get the cast weight"
    xv = rng.standard_normal((64, 48)).astype("float32")
    np.testing.assert_allclose(compiled(xv), run_vm(mod, xv)[0], rtol=1e-5, atol=1e-5)
