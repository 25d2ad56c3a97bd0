"""verify_contracts finds each kind of broken annotation."""

from __future__ import annotations

import pytest
from tvm import relax

from aicf_tvm import EMIT_ATTR, ContractViolation, Emit, emit_of, verify_contracts
from aicf_tvm.core.contract import EmitContract, PortFacts
from aicf_tvm.core.lattice import Effect, ShapeFact
from aicf_tvm.driver.explainer import lift_and_propagate
from aicf_tvm.driver.models import BUILTIN_MODELS


def _lifted():
    return lift_and_propagate(BUILTIN_MODELS["encoder_layer_small"]())


def _first_emit(mod, kind):
    for gv, f in mod.functions_items():
        e = emit_of(f) if isinstance(f, relax.Function) else None
        if e is not None and e.kind == kind:
            return gv, f, e
    raise AssertionError(kind)


def _replace(mod, gv, func, emit):
    mod = mod.clone() if hasattr(mod, "clone") else mod
    mod[gv] = func.with_attr(EMIT_ATTR, emit.to_attr())
    return mod


def test_lifted_models_verify():
    verify_contracts(_lifted())


def test_shape_fact_contradicting_the_type_is_reported():
    mod = _lifted()
    gv, func, emit = _first_emit(mod, "softmax")
    bad = emit.contract.provides.with_port("out", PortFacts(effect=Effect("Write"), shape=ShapeFact.shape([3, 3])))
    mod = _replace(mod, gv, func, Emit(emit.kind, emit.attrs, emit.interface,
                                       EmitContract(emit.contract.requires, bad), emit.math, emit.op))
    with pytest.raises(ContractViolation, match=r"emit_softmax.*port out shape \[3x3\] contradicts type"):
        verify_contracts(mod)


def test_output_claiming_no_write_is_reported():
    mod = _lifted()
    gv, func, emit = _first_emit(mod, "gelu")
    out = emit.contract.provides.port("out")
    bad = emit.contract.provides.with_port("out", PortFacts(Effect("Read"), out.shape, out.numeric, out.abi))
    mod = _replace(mod, gv, func, Emit(emit.kind, emit.attrs, emit.interface,
                                       EmitContract(emit.contract.requires, bad), emit.math, emit.op))
    with pytest.raises(ContractViolation, match="output port out claims effect Read"):
        verify_contracts(mod)


def test_missing_primitive_and_malformed_annotation_are_reported():
    mod = _lifted()
    gv, func, _ = _first_emit(mod, "gelu")
    mod[gv] = func.without_attr("Primitive")
    with pytest.raises(ContractViolation, match="not marked Primitive"):
        verify_contracts(mod)
    mod[gv] = func.with_attr(EMIT_ATTR, {"version": 1, "kind": "gelu"})
    with pytest.raises(ContractViolation, match="malformed aicf.emit"):
        verify_contracts(mod)
