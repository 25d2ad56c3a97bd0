"""FuseAdamSteps: every adam_step of a block -> one in-place kernel, only when aliasing allows."""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.script import ir as I
from tvm.script import relax as R

from aicf_tvm import emit_of
from aicf_tvm.core.kinds.adam import DISTINCT_INPUTS_ATTR
from aicf_tvm.core.lattice import MAY_ALIAS, NO_ALIAS, UNKNOWN_ALIAS
from aicf_tvm.core.report import FusionReport
from aicf_tvm.driver.optimizer import adam_function
from relax_passes import LiftEmits, PropagateContracts
from relax_passes.fuse_adam_steps import FuseAdamSteps
from relax_passes.lift_adam_steps import LiftAdamSteps

from ..conftest import run_vm


def _prepared(mod: tvm.IRModule, distinct: bool) -> tvm.IRModule:
    if distinct:
        mod = tvm.IRModule({gv: (f.with_attr(DISTINCT_INPUTS_ATTR, True) if gv.name_hint == "main" else f)
                            for gv, f in mod.functions_items()})
    return PropagateContracts()(LiftEmits()(LiftAdamSteps()(mod)))


def _fuse(mod: tvm.IRModule, distinct: bool = True) -> tuple[tvm.IRModule, FusionReport]:
    report = FusionReport()
    return FuseAdamSteps(report=report)(_prepared(mod, distinct)), report


def _tvm_adam() -> tvm.IRModule:
    func = adam_function([(3, 4), (4,), (2, 2)], lr=0.01, weight_decay=0.01)
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def _inplace_calls(mod: tvm.IRModule) -> list:
    return [b.value for blk in mod["main"].body.blocks for b in blk.bindings
            if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.call_tir_inplace"]


def _step(weights: str = "p", grad: str = "g"):
    """A hand-written one-parameter step; ``grad`` may be derived from ``m`` to make them alias."""

    @I.ir_module
    class Mod:
        @R.function
        def main(p: R.Tensor((8,), "float32"), g: R.Tensor((8,), "float32"), m: R.Tensor((8,), "float32"),
                 v: R.Tensor((8,), "float32"), b1: R.Tensor((), "float32"), b2: R.Tensor((), "float32")):
            with R.dataflow():
                gr = R.reshape(m, (8,)) if grad == "view_of_m" else g
                m1 = R.add(R.multiply(R.const(0.9, "float32"), m), R.multiply(R.const(0.1, "float32"), gr))
                v1 = R.add(R.multiply(R.const(0.999, "float32"), v),
                           R.multiply(R.const(0.001, "float32"), R.multiply(gr, gr)))
                d = R.add(R.sqrt(R.divide(v1, b2)), R.const(1e-8, "float32"))
                p1 = R.subtract(p, R.multiply(R.const(0.01, "float32"), R.divide(R.divide(m1, b1), d)))
                old = R.sum(p) if weights == "read_old" else R.sum(p1)
                R.output(p1, m1, v1, old)
            return (p1, m1, v1, old)

    return Mod


def _two_steps(lr_p: float, lr_q: float):
    """Two one-parameter steps that differ only in their learning rate."""

    @I.ir_module
    class Mod:
        @R.function
        def main(p: R.Tensor((8,), "float32"), q: R.Tensor((8,), "float32"), g: R.Tensor((8,), "float32"),
                 m: R.Tensor((8,), "float32"), v: R.Tensor((8,), "float32"), mq: R.Tensor((8,), "float32"),
                 vq: R.Tensor((8,), "float32"), b1: R.Tensor((), "float32"), b2: R.Tensor((), "float32")):
            with R.dataflow():
                m1 = R.add(R.multiply(R.const(0.9, "float32"), m), R.multiply(R.const(0.1, "float32"), g))
                v1 = R.add(R.multiply(R.const(0.999, "float32"), v),
                           R.multiply(R.const(0.001, "float32"), R.multiply(g, g)))
                p1 = R.subtract(p, R.multiply(R.const(lr_p, "float32"), R.divide(
                    R.divide(m1, b1), R.add(R.sqrt(R.divide(v1, b2)), R.const(1e-8, "float32")))))
                m2 = R.add(R.multiply(R.const(0.9, "float32"), mq), R.multiply(R.const(0.1, "float32"), g))
                v2 = R.add(R.multiply(R.const(0.999, "float32"), vq),
                           R.multiply(R.const(0.001, "float32"), R.multiply(g, g)))
                q1 = R.subtract(q, R.multiply(R.const(lr_q, "float32"), R.divide(
                    R.divide(m2, b1), R.add(R.sqrt(R.divide(v2, b2)), R.const(1e-8, "float32")))))
                R.output(p1, m1, v1, q1, m2, v2)
            return (p1, m1, v1, q1, m2, v2)

    return Mod


def test_steps_whose_lr_differ_in_the_sign_of_zero_are_not_one_kernel():
    """lr 0.0 and -0.0 are different steps (p - (-0.0) * s turns p = -0.0 into +0.0):
    the kernel takes one step's constants, so the group is refused, as for 0.01 vs 0.02."""
    _, same = _fuse(_two_steps(0.01, 0.01))
    assert same.accepted and not same.refused
    for lr_q in (0.02, -0.0):
        _, report = _fuse(_two_steps(0.0, lr_q))
        assert not report.accepted and "steps differ in lr" in report.refused[0].note


def test_fuses_every_step_into_one_inplace_kernel():
    """Three parameters, caller asserts distinct inputs: one call_tir_inplace updating
    P, M, V of each (inputs 0, 2, 3 of every group of six), and no adam_step left."""
    after, report = _fuse(_tvm_adam())
    calls = _inplace_calls(after)
    assert len(calls) == 1 and report.accepted and not report.refused
    assert [int(i) for i in calls[0].attrs.inplace_indices] == [0, 2, 3, 6, 8, 9, 12, 14, 15]
    kernel = after[calls[0].args[0]]
    assert isinstance(kernel, tirx.PrimFunc) and str(kernel.attrs["aicf.kind"]) == "fused_adam_step"
    assert not any(emit_of(f) is not None and emit_of(f).kind == "adam_step"
                   for _, f in after.functions_items() if isinstance(f, relax.Function))


def test_refuses_when_caller_inputs_may_alias():
    """Without the caller's assertion two caller inputs are Unknown: refused, naming the pair."""
    before = _prepared(_tvm_adam(), distinct=False)
    report = FusionReport()
    after = FuseAdamSteps(report=report)(before)
    assert tvm_ffi.structural_equal(after, before)
    text = str(report)
    assert "alias(w0.grad, w0.m): Unknown ⋢ NoAlias required by fused_adam_step" in text
    assert report.refused[0].failures[0].have == UNKNOWN_ALIAS


def test_refuses_when_grad_is_a_view_of_m():
    """G is a reshape of M: MayAlias even though the caller's inputs are distinct."""
    _, report = _fuse(_step(grad="view_of_m"))
    fails = {f.path: f.have for f in report.refused[0].failures}
    assert fails["alias(p.grad, p.m)"] == MAY_ALIAS
    assert "MayAlias ⋢ NoAlias required by fused_adam_step" in str(report)


def test_refuses_when_old_param_is_read_after_the_step():
    after, report = _fuse(_step(weights="read_old"))
    assert not _inplace_calls(after)
    assert "reads the old p after fused_adam_step" in report.refused[0].note


def test_fused_step_computes_what_the_steps_did():
    before = _step()
    after, report = _fuse(before)
    assert report.accepted
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(8).astype("float32") for _ in range(4)]
    args[3] = np.abs(args[3])
    args += [np.array(0.1, "float32"), np.array(0.001, "float32")]
    want = run_vm(before, *[a.copy() for a in args])
    got = run_vm(after, *[a.copy() for a in args])
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)


def test_is_idempotent():
    once, _ = _fuse(_tvm_adam())
    assert tvm_ffi.structural_equal(FuseAdamSteps()(once), once)


def test_proven_facts_are_recorded_on_the_kernel():
    after, _ = _fuse(_tvm_adam())
    emit = emit_of(after[_inplace_calls(after)[0].args[0]])
    assert emit.kind == "fused_adam_step"
    assert emit.contract.provides.alias_of("w1.grad", "w1.m") == NO_ALIAS
