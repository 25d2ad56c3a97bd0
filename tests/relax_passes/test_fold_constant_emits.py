"""FoldConstantEmits: an effect-free Emit of constants only is computed at compile time."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from aicf_tvm import emit_of
from aicf_tvm.core.report import FusionReport
from relax_passes import FoldConstantEmits, LiftEmits, MaterializeEmits, PropagateContracts

from ..conftest import run_vm


def transposed_weight(constant: bool) -> tvm.IRModule:
    """x @ wᵀ with w a constant (or a parameter)."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    params = [x]
    if constant:
        w = relax.const(rng.standard_normal((16, 8)).astype("float32"))
    else:
        w = relax.Var("w", relax.TensorType((16, 8), "float32"))
        params.append(w)
    with bb.function("main", params):
        with bb.dataflow():
            wt = bb.emit(relax.op.permute_dims(w, [1, 0]))
            out = bb.emit_output(relax.op.matmul(x, wt))
        bb.emit_func_output(out)
    return PropagateContracts()(LiftEmits()(bb.get()))


def emit_kinds(mod: tvm.IRModule) -> list[str]:
    return sorted(emit_of(f).kind for _, f in mod.functions_items()
                  if isinstance(f, relax.Function) and emit_of(f) is not None)


def test_a_transpose_of_a_constant_weight_is_computed_now():
    """The permute_dims Emit reads only a constant: its result becomes a constant, and the
    module computes what it did."""
    before = transposed_weight(constant=True)
    report = FusionReport()
    after = FoldConstantEmits(report=report)(before)
    assert emit_kinds(before) == ["matmul", "permute_dims"] and emit_kinds(after) == ["matmul"]
    [decision] = report.decisions
    assert decision.candidate == "materialize:permute_dims" and decision.accepted
    assert "compile time" in decision.note
    x = np.random.default_rng(1).standard_normal((4, 8)).astype("float32")
    np.testing.assert_allclose(run_vm(after, x)[0], run_vm(before, x)[0], rtol=1e-6)


def test_a_transpose_of_a_runtime_weight_stays():
    before = transposed_weight(constant=False)
    report = FusionReport()
    assert FoldConstantEmits(report=report)(before).same_as(before) and not report.decisions


def test_materialize_emits_folds_the_same_way():
    """MaterializeEmits runs this job after its inserts: alone it gives the same module."""
    before = transposed_weight(constant=True)
    tvm.ir.assert_structural_equal(MaterializeEmits()(before), FoldConstantEmits()(before))
