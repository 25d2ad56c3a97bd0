"""LiftAdamSteps: each parameter's Adam update becomes one ``adam_step`` Emit call."""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from aicf_tvm import emit_of, verify_contracts
from aicf_tvm.core.kinds.adam import DISTINCT_INPUTS_ATTR
from aicf_tvm.core.lattice import NO_ALIAS, READ, READWRITE
from aicf_tvm.driver.optimizer import adam_function
from relax_passes.lift_adam_steps import LiftAdamSteps, adam_attrs

from ..conftest import run_vm


@I.ir_module
class HandWritten:
    """No weight decay, operands commuted, ``(lr * m_hat) / denom``: still one Adam step."""

    @R.function
    def main(p: R.Tensor((8, 4), "float32"), g: R.Tensor((8, 4), "float32"), m: R.Tensor((8, 4), "float32"),
             v: R.Tensor((8, 4), "float32"), b1: R.Tensor((), "float32"), b2: R.Tensor((), "float32")):
        with R.dataflow():
            m1 = R.add(R.multiply(m, R.const(0.9, "float32")), R.multiply(g, R.const(0.1, "float32")))
            v1 = R.add(R.multiply(R.const(0.999, "float32"), v),
                       R.multiply(R.const(0.001, "float32"), R.multiply(g, g)))
            d = R.add(R.sqrt(R.divide(v1, b2)), R.const(1e-8, "float32"))
            p1 = R.subtract(p, R.divide(R.multiply(R.const(0.01, "float32"), R.divide(m1, b1)), d))
            R.output(p1, m1, v1)
        return (p1, m1, v1)


def _adam_steps(mod: tvm.IRModule) -> list:
    return [(gv.name_hint, emit_of(f)) for gv, f in mod.functions_items()
            if isinstance(f, relax.Function) and emit_of(f) is not None and emit_of(f).kind == "adam_step"]


def _calls(mod: tvm.IRModule) -> list[str]:
    return [b.value.op.name_hint for blk in mod["main"].body.blocks for b in blk.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, relax.GlobalVar)]


def _tvm_adam(weight_decay: float = 0.1) -> tvm.IRModule:
    func = adam_function([(3, 4), (4,)], lr=0.01, weight_decay=weight_decay)
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def test_lifts_each_parameter_of_tvm_adam():
    """TVM's Adam (with weight decay) has one update per parameter: two adam_step calls,
    effects P, M, V = ReadWrite and G, bias terms = Read, attrs from its constants."""
    after = LiftAdamSteps()(_tvm_adam())
    verify_contracts(after)
    assert len(_calls(after)) == 2
    steps = _adam_steps(after)
    assert len(steps) == 2
    emit = steps[0][1]
    provides = emit.contract.provides
    assert [provides.port(p).effect for p in ("param", "m", "v")] == [READWRITE] * 3
    assert [provides.port(p).effect for p in ("grad", "bias1", "bias2")] == [READ] * 3
    attrs = emit.attr_dict
    assert np.isclose(attrs["lr"], 0.01) and np.isclose(attrs["weight_decay"], 0.1)
    assert np.isclose(attrs["beta1"], 0.9) and np.isclose(attrs["beta2"], 0.999)
    assert not any(isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
                   and b.value.op.name == "relax.sqrt" for blk in after["main"].body.blocks for b in blk.bindings)


def test_lifts_hand_written_update_and_computes_the_same():
    after = LiftAdamSteps()(HandWritten)
    verify_contracts(after)
    assert _calls(after) == ["adam_step"]
    assert _adam_steps(after)[0][1].attr_dict["weight_decay"] == 0.0
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((8, 4)).astype("float32") for _ in range(4)]
    args[3] = np.abs(args[3])
    args += [np.array(0.1, "float32"), np.array(0.001, "float32")]
    for want, got in zip(run_vm(HandWritten, *args), run_vm(after, *args)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_keeps_update_whose_intermediate_is_used_elsewhere():
    """The m_hat of the update is also returned: lifting would have to drop it, so no change."""

    @I.ir_module
    class Mod:
        @R.function
        def main(p: R.Tensor((4,), "float32"), g: R.Tensor((4,), "float32"), m: R.Tensor((4,), "float32"),
                 v: R.Tensor((4,), "float32"), b1: R.Tensor((), "float32"), b2: R.Tensor((), "float32")):
            with R.dataflow():
                m1 = R.add(R.multiply(R.const(0.9, "float32"), m), R.multiply(R.const(0.1, "float32"), g))
                v1 = R.add(R.multiply(R.const(0.999, "float32"), v),
                           R.multiply(R.const(0.001, "float32"), R.multiply(g, g)))
                mh = R.divide(m1, b1)
                d = R.add(R.sqrt(R.divide(v1, b2)), R.const(1e-8, "float32"))
                p1 = R.subtract(p, R.multiply(R.const(0.01, "float32"), R.divide(mh, d)))
                R.output(p1, m1, v1, mh)
            return (p1, m1, v1, mh)

    assert tvm_ffi.structural_equal(LiftAdamSteps()(Mod), Mod)


def test_refuses_constants_that_are_not_adam():
    """(1 - β1) must be the complement of β1: 0.9 and 0.2 is not an Adam step."""
    assert adam_attrs({"lr": relax.const(0.1, "float32"), "beta1": relax.const(0.9, "float32"),
                       "one_minus_beta1": relax.const(0.2, "float32"), "beta2": relax.const(0.99, "float32"),
                       "one_minus_beta2": relax.const(0.01, "float32"), "eps": relax.const(1e-8, "float32")}) is None


def test_is_idempotent():
    once = LiftAdamSteps()(_tvm_adam())
    assert tvm_ffi.structural_equal(LiftAdamSteps()(once), once)


def test_asserts_noalias_only_between_distinct_caller_inputs():
    mod = _tvm_adam(0.0)
    mod["main"] = mod["main"].with_attr(DISTINCT_INPUTS_ATTR, True)
    emit = _adam_steps(LiftAdamSteps()(mod))[0][1]
    assert emit.asserted.alias_of("grad", "m") == NO_ALIAS
    assert emit.asserted.alias_of("param", "bias1").is_top()  # the bias term is computed, not a caller input
    assert all(e.asserted.alias == () for _, e in _adam_steps(LiftAdamSteps()(_tvm_adam(0.0))))


def test_round_trips_through_script_and_json():
    after = LiftAdamSteps()(_tvm_adam())
    tvm.ir.assert_structural_equal(tvm.script.from_source(after.script()), after)
    tvm.ir.assert_structural_equal(tvm.ir.load_json(tvm.ir.save_json(after)), after)
