"""Entailment F ⊢ R and its explanation of every failing component."""

from __future__ import annotations

from aicf_tvm.core.contract import (
    ADAM_STEP_CONTRACT,
    RELU_CONTRACT,
    ContractFacts,
    PortFacts,
    entails,
)
from aicf_tvm.core.lattice import (
    AccumDtype,
    Alias,
    Effect,
    NumericFact,
    ShapeFact,
)


def test_entailment_succeeds_when_every_component_is_stronger():
    facts = ContractFacts.of(
        {"x": PortFacts(shape=ShapeFact.contiguous([4, 8]), numeric=NumericFact.exact("float32"))},
        {("x", "y"): Alias("NoAlias")},
    )
    req = ContractFacts.of(
        {"x": PortFacts(shape=ShapeFact.shape([4, 8]))}, {("y", "x"): Alias("MayAlias")}
    )
    result = entails(facts, req)
    assert result and result.explain() == "entailed"


def test_entailment_names_every_failing_component_with_both_values():
    facts = ContractFacts.of(
        {"acc": PortFacts(numeric=NumericFact(accumulation=AccumDtype("float16")),
                          shape=ShapeFact((4, 8), (1, 4)))},
        {("P", "G"): Alias("MayAlias")},
    )
    req = ContractFacts.of(
        {"acc": PortFacts(numeric=NumericFact(accumulation=AccumDtype("float32")),
                          shape=ShapeFact.contiguous([4, 8]))},
        {("P", "G"): Alias("NoAlias")},
    )
    result = entails(facts, req, by="fused_adam_step")
    assert not result
    paths = sorted(f.path for f in result.failures)
    assert paths == ["acc.numeric.accumulation", "acc.shape", "alias(G, P)"]
    text = result.explain()
    assert "acc.numeric.accumulation: float16 ⋢ float32 required by fused_adam_step" in text
    assert "alias(G, P): MayAlias ⋢ NoAlias required by fused_adam_step" in text
    assert "[4x8] strides(1,4) ⋢ [4x8] contiguous" in text


def test_missing_fact_is_top_and_fails_a_real_requirement():
    result = entails(ContractFacts(), ContractFacts.of({"x": PortFacts(effect=Effect("Read"))}))
    assert [f.path for f in result.failures] == ["x.effect"]
    assert result.failures[0].have == Effect("ReadWrite")


def test_seed_contracts():
    relu = RELU_CONTRACT.provides
    assert relu.port("x").effect == Effect("Read") and relu.port("out").effect == Effect("Write")
    adam = ADAM_STEP_CONTRACT.provides
    assert [adam.port(p).effect.value for p in ("param", "m", "v", "grad")] == [
        "ReadWrite", "ReadWrite", "ReadWrite", "Read"]
    # relu's effects entail "reads x at most"; adam's do not.
    req = ContractFacts.of({"x": PortFacts(effect=Effect("Read"))})
    assert entails(relu, req)
    assert not entails(adam.with_port("x", adam.port("param")), req)
