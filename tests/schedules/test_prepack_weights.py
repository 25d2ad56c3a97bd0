"""prepack_weights: constant GEMM operands packed at compile time, kernel by kernel; a
kernel that cannot be prepacked keeps its per-call packing and the others are unaffected."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.script import tirx as T

import aicf_tvm
from aicf_tvm.core.report import FusionReport
from aicf_tvm.driver.pipeline import build, normalize, optimize, resolve_target
from relax_passes import LowerEmits
from relax_passes.lower_emits import kernel_calls
from schedules import apply_default_schedules
from schedules.prepack_weights import mark_layout_free, prepack_weights, preproc_blocks

from ..conftest import run_vm

TARGET = {"kind": "llvm", "num-cores": 2}


def _main(params, body, mod=None):
    """``mod`` (or an empty module) with a main that takes ``params`` and returns
    ``body(bb, *params)``."""
    if mod is not None:
        mod = mod.clone()
        del mod["main"]
    bb = relax.BlockBuilder(mod)
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def _prepack_decisions(compiled):
    return [d for d in compiled.report.decisions if d.candidate == "materialize:layout_transform"]


def _is_prepacked(compiled, kernel) -> bool:
    abi = compiled.lowered[kernel.name].attrs["aicf.abi"]
    return kernel.name.endswith("_prepacked") and any(dict(e).get("prepacked") for e in abi)


def test_weight_also_read_by_the_epilogue_keeps_its_packing_in_the_kernel():
    """``(x @ W1 + W1) @ W2``: the first kernel's epilogue reads W1 unpacked, so W1 is not
    swapped for its packed form (the read would dangle); W2, read by its packing only, is
    still packed at compile time."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((96, 96)).astype("float32")
    w2 = rng.standard_normal((96, 80)).astype("float32")
    x = relax.Var("x", relax.TensorType((96, 96), "float32"))
    c1 = relax.const(w1)  # one constant, so the fused kernel takes it as one parameter
    mod = _main([x], lambda _, x: relax.op.matmul(relax.op.add(relax.op.matmul(x, c1), c1), relax.const(w2)))
    compiled = aicf_tvm.compile(mod, target=TARGET)
    assert [(k.kind, _is_prepacked(compiled, k)) for k in compiled.kernels] == [
        ("fused_gemm_bias_act", False), ("matmul", True)]
    refused = [d for d in _prepack_decisions(compiled) if not d.accepted]
    assert len(refused) == 1 and "also reads the unpacked weight" in refused[0].note
    xv = rng.standard_normal((96, 96)).astype("float32")
    np.testing.assert_allclose(compiled(xv), (xv @ w1 + w1) @ w2, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(compiled(xv), run_vm(mod, xv)[0], rtol=1e-4, atol=1e-3)


def test_cumsum_of_a_constant_beside_a_prepacked_gemm():
    """TVM's scan kernel has no ``root`` block: prepacking must not assume one. The GEMM's
    weight is still packed at compile time."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((48, 96)).astype("float32")
    c = rng.standard_normal((64, 96)).astype("float32")
    x = relax.Var("x", relax.TensorType((64, 48), "float32"))
    mod = _main([x], lambda _, x: relax.op.add(relax.op.matmul(x, relax.const(w)),
                                            relax.op.cumsum(relax.const(c), axis=1)))
    compiled = aicf_tvm.compile(mod, target=TARGET)
    [gemm] = [k for k in compiled.kernels if k.kind == "fused_gemm_bias_act"]
    assert _is_prepacked(compiled, gemm)
    xv = rng.standard_normal((64, 48)).astype("float32")
    np.testing.assert_allclose(compiled(xv), xv @ w + np.cumsum(c, axis=1), rtol=1e-4, atol=1e-4)


def test_gemm_is_prepacked_in_a_model_with_a_scan_kernel():
    """TVM's split reads every PrimFunc of the module it is given and refuses the scan
    kernel of ``cumsum``; prepacking the GEMM must not depend on it."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((48, 96)).astype("float32")
    x = relax.Var("x", relax.TensorType((64, 48), "float32"))
    mod = _main([x], lambda _, x: relax.op.cumsum(relax.op.nn.relu(relax.op.matmul(x, relax.const(w))), axis=1))
    compiled = aicf_tvm.compile(mod, target=TARGET)
    assert sorted(k.kind for k in compiled.kernels) == ["cumsum", "fused_gemm_bias_act"]
    [gemm] = [k for k in compiled.kernels if k.kind == "fused_gemm_bias_act"]
    assert _is_prepacked(compiled, gemm)
    xv = rng.standard_normal((64, 48)).astype("float32")
    np.testing.assert_allclose(compiled(xv), np.cumsum(np.maximum(xv @ w, 0), axis=1), rtol=1e-4, atol=1e-4)


@T.prim_func(private=True, s_tir=True)
def _unsplittable(a: T.Buffer((64, 96), "float32"), w: T.Buffer((64, 96), "float32"),
                  out: T.Buffer((64, 96), "float32")):
    """a + w, with w's marked copy in the same loop nest as its reader: TVM cannot split it."""
    T.func_attr({"layout_free_buffers": [1], "tirx.noalias": True, "tirx.is_scheduled": True})
    wt = T.alloc_buffer((96, 64), "float32")
    for i in range(64):
        for j in range(96):
            with T.sblock("pack"):
                vi, vj = T.axis.remap("SS", [i, j])
                T.sblock_attr({"meta_schedule.layout_rewrite_preproc": 1})
                wt[vj, vi] = w[vi, vj]
        for j in range(96):
            with T.sblock("add"):
                vi, vj = T.axis.remap("SS", [i, j])
                out[vi, vj] = a[vi, vj] + wt[vj, vi]


def test_one_refused_kernel_leaves_the_others_prepacked():
    """``relu(x @ W) + V`` scheduled as aicf_tvm.compile does, plus a kernel whose marked
    packing TVM's split refuses: that kernel is named in the refusals and keeps packing
    per call, the GEMM is still prepacked, and the module computes the same values."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((48, 96)).astype("float32")
    v = rng.standard_normal((64, 96)).astype("float32")
    x = relax.Var("x", relax.TensorType((64, 48), "float32"))
    target = resolve_target(TARGET)
    with target:
        mod = LowerEmits()(optimize(normalize(_main([x], lambda _, x: relax.op.nn.relu(
            relax.op.matmul(x, relax.const(w))))), FusionReport()))
        [gemm] = kernel_calls(mod["main"])
        ty = relax.TensorType((64, 96), "float32")
        mod = _main([relax.Var("x", x.ty)], lambda bb, x: relax.call_tir(
            bb.add_func(_unsplittable, "unsplittable"),
            [relax.call_tir(mod.get_global_var(gemm), [x, relax.const(w)], ty), relax.const(v)], ty), mod)
        scheduled = apply_default_schedules(target)(mark_layout_free(mod))
        assert preproc_blocks(scheduled[gemm]) and preproc_blocks(scheduled["unsplittable"])
        prepacked, packed, refused = prepack_weights(scheduled)
    assert [p.kernel for p in packed] == [f"{gemm}_prepacked"]
    assert [r.kernel for r in refused] == ["unsplittable"]
    assert sorted(kernel_calls(prepacked["main"])) == sorted([f"{gemm}_prepacked", "unsplittable"])
    assert not preproc_blocks(prepacked["unsplittable"])
    vm = relax.VirtualMachine(build(prepacked, target), tvm.cpu())
    xn = rng.standard_normal((64, 48)).astype("float32")
    got = vm["main"](tvm.runtime.tensor(xn)).numpy()
    np.testing.assert_allclose(got, np.maximum(xn @ w, 0) + v, rtol=1e-5, atol=1e-5)


def test_weight_of_a_gemm_with_symbolic_rows_is_prepacked():
    """``x[seq, 96] @ W + b``: the activation's ``seq`` is a fresh Var in the split kernel;
    only the constant W changes shape, so it is packed once and every length still matches."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((96, 80)).astype("float32")
    b = rng.standard_normal(80).astype("float32")
    seq = tvm.tirx.Var("seq", "int64")
    x = relax.Var("x", relax.TensorType((seq, 96), "float32"))
    mod = _main([x], lambda _, x: relax.op.add(relax.op.matmul(x, relax.const(w)), relax.const(b)))
    compiled = aicf_tvm.compile(mod, target=TARGET)
    (gemm,) = compiled.kernels
    assert gemm.schedule == "Gemm" and _is_prepacked(compiled, gemm)
    for rows in (1, 7, 33, 100):
        xs = rng.standard_normal((rows, 96)).astype("float32")
        np.testing.assert_allclose(compiled(xs), xs @ w + b, rtol=1e-4, atol=1e-3)
