"""``get_pipeline(options)`` (aicf_tvm/driver/pipeline.py): what ``compile`` does to a
module before it builds, as a ``tvm.transform.Pass`` that TVM's own ``tvm.compile`` takes
as its Relax pipeline, or that runs inside a user's ``Sequential``."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

import aicf_tvm
from aicf_tvm import CompileOptions
from aicf_tvm.core.report import FusionReport
from aicf_tvm.driver.pipeline import normalize, optimize
from aicf_tvm.runtime.targets import resolve_target
from relax_passes import LowerEmits

from ...helpers import relax_main


def _mlp() -> tuple[tvm.IRModule, list[np.ndarray]]:
    """relu(x @ w1 + b1) @ w2 with constant weights: a GEMM with its epilogue, then a GEMM."""
    rng = np.random.default_rng(0)
    w1, b1, w2 = (rng.standard_normal(s).astype("float32") for s in ((32, 48), (48,), (48, 16)))
    x = relax.Var("x", relax.TensorType((8, 32), "float32"))

    def body(bb: relax.BlockBuilder, x: relax.Var) -> relax.Expr:
        h = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.matmul(x, relax.const(w1)), relax.const(b1))))
        return relax.op.matmul(h, relax.const(w2))

    return relax_main([x], body), [w1, b1, w2]


def _reference(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    return np.maximum(x @ w1 + b1, 0) @ w2


def _decisions(report: FusionReport) -> list[str]:
    return [str(d) for d in report.decisions]


def test_tvm_compile_with_our_pipeline_gives_the_outputs_report_and_kernels_of_compile():
    mod, weights = _mlp()
    target = resolve_target("llvm")
    options = CompileOptions(target=target)
    compiled = aicf_tvm.compile(mod, options=options)
    report = FusionReport()
    executable = tvm.compile(mod, target=target, relax_pipeline=aicf_tvm.get_pipeline(options, report=report))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    x = np.random.default_rng(1).standard_normal((8, 32)).astype("float32")
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    want = np.asarray(compiled(x))
    np.testing.assert_allclose(got, _reference(x, *weights), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert _decisions(report) == _decisions(compiled.report)

    lowered = aicf_tvm.get_pipeline(options, finalize=False)(mod)
    tvm.ir.assert_structural_equal(lowered, compiled.lowered)


def test_the_pass_takes_the_target_of_the_enclosing_context_inside_a_sequential():
    """No target in the options: the pass reads ``with target:``, as TVM's passes do."""
    mod, _ = _mlp()
    target = resolve_target("llvm")
    seq = tvm.transform.Sequential([relax.transform.ConvertToDataflow(),
                                    aicf_tvm.get_pipeline(CompileOptions(), finalize=False)])
    with target:
        lowered = seq(mod)
    tvm.ir.assert_structural_equal(lowered, aicf_tvm.compile(mod, target=target).lowered)


def test_lower_emits_takes_its_target_from_the_options_as_from_the_context():
    mod, _ = _mlp()
    target = resolve_target("llvm")
    optimized = optimize(normalize(mod), FusionReport(), target=target)
    with target:
        in_context = LowerEmits()(optimized)
    assert tvm_ffi.structural_equal(LowerEmits(CompileOptions(target=target))(optimized), in_context)


def test_compile_keywords_and_options_build_alike():
    mod, _ = _mlp()
    by_keywords = aicf_tvm.compile(mod, "llvm", threads=1)
    by_options = aicf_tvm.compile(mod, options=CompileOptions(target="llvm", threads=1))
    tvm.ir.assert_structural_equal(by_keywords.lowered, by_options.lowered)
    assert by_options.threads == by_keywords.threads == 1


def test_the_pass_without_a_target_says_where_to_give_one():
    mod, _ = _mlp()
    with pytest.raises(aicf_tvm.TargetError, match="set CompileOptions.target"):
        aicf_tvm.get_pipeline()(mod)
