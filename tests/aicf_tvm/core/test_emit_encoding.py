"""An Emit encoded in ``aicf.emit`` survives TVMScript and JSON round trips."""

from __future__ import annotations

import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from aicf_tvm import EMIT_ATTR, Emit, EncodingError, Interface, Port, emit_of
from aicf_tvm.core.contract import ContractFacts, EmitContract, PortFacts
from aicf_tvm.core.lattice import (
    ABIFact,
    AccumDtype,
    Alias,
    Alignment,
    Effect,
    MathTag,
    NumericFact,
    ShapeFact,
)


def sample_emit() -> Emit:
    x = PortFacts(effect=Effect("Read"), shape=ShapeFact(("n", 768), (768, 1)),
                  abi=ABIFact(alignment=Alignment(64)))
    out = PortFacts(effect=Effect("Write"), shape=ShapeFact((None, 768)),
                    numeric=NumericFact(MathTag("approx:fast_exp"), AccumDtype("float32")))
    return Emit(
        kind="fused_gemm_bias_act",
        attrs={"activation": "gelu", "epsilon": 1e-5, "axes": [0, -1], "transpose_b": True},
        interface=Interface((Port("x", "float32", 2),), (Port("out", "float16", 2),)),
        contract=EmitContract(
            requires=ContractFacts.of({"x": PortFacts(shape=ShapeFact.rank(2))}),
            provides=ContractFacts.of({"x": x, "out": out}, {("x", "out"): Alias("NoAlias")}),
        ),
        op="relax.matmul",
    )


def module_with(emit: Emit) -> tvm.IRModule:
    @I.ir_module
    class Mod:
        @R.function(private=True)
        def emit_fn(x: R.Tensor(("n", 768), "float32")) -> R.Tensor(("n", 768), "float32"):
            R.func_attr({"Primitive": True})
            with R.dataflow():
                y = R.nn.relu(x)
                R.output(y)
            return y

        @R.function
        def main(x: R.Tensor(("n", 768), "float32")) -> R.Tensor(("n", 768), "float32"):
            cls = Mod
            with R.dataflow():
                y = cls.emit_fn(x)
                R.output(y)
            return y

    gv = Mod.get_global_var("emit_fn")
    Mod[gv] = Mod[gv].with_attr(EMIT_ATTR, emit.to_attr())
    return Mod


def test_tvmscript_round_trip_is_unchanged_and_decodes_equal():
    mod = module_with(sample_emit())
    again = tvm.script.from_source(mod.script())
    tvm.ir.assert_structural_equal(mod, again)
    assert emit_of(again["emit_fn"]) == sample_emit()


def test_json_round_trip_is_unchanged_and_decodes_equal():
    mod = module_with(sample_emit())
    again = tvm.ir.load_json(tvm.ir.save_json(mod))
    tvm.ir.assert_structural_equal(mod, again)
    assert emit_of(again["emit_fn"]) == sample_emit()


def test_float_attrs_survive_exactly():
    emit = Emit("x", attrs={"eps": 1e-12, "scale": 0.125, "odd": 1 / 3})
    mod = module_with(emit)
    for again in (tvm.script.from_source(mod.script()), tvm.ir.load_json(tvm.ir.save_json(mod))):
        assert emit_of(again["emit_fn"]).attr_dict == emit.attr_dict


def test_emit_equality_tells_floats_apart_as_tvm_does():
    """Two Emits are equal exactly when TVM finds their encodings structurally equal:
    a -0.0 attr is not a 0.0 attr (Python's 0.0 == -0.0), a NaN attr equals itself after
    a round trip (Python's nan != nan)."""
    values = [0.0, -0.0, float("nan"), 1.0]
    for a in values:
        for b in values:
            ea, eb = Emit("x", attrs={"v": a}), Emit("x", attrs={"v": b})
            same = tvm_ffi.structural_equal(module_with(ea), module_with(eb))
            assert (ea == eb) == same and (not same or hash(ea) == hash(eb)), (a, b)
    nan = Emit("x", attrs={"v": float("nan")})
    # JSON only: TVMScript prints a non-finite float attr so that it parses back as a string
    assert emit_of(tvm.ir.load_json(tvm.ir.save_json(module_with(nan)))["emit_fn"]) == nan


def test_unannotated_function_has_no_emit():
    mod = module_with(sample_emit())
    assert emit_of(mod["main"]) is None


def test_malformed_annotation_is_our_error():
    with pytest.raises(EncodingError, match="malformed aicf.emit"):
        Emit.from_attr({"version": 1, "kind": "relu"})
    with pytest.raises(EncodingError, match="format version"):
        Emit.from_attr({"version": 99})


def test_module_still_builds_after_annotation():
    mod = module_with(sample_emit())
    ex = tvm.compile(mod, target="llvm", relax_pipeline=relax.get_default_pipeline(tvm.target.Target("llvm")))
    assert ex is not None
