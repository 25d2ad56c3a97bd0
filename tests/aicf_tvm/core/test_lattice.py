"""Every contract lattice obeys the lattice laws; the documented orders hold."""

from __future__ import annotations

import pytest

from aicf_tvm import AliasContradiction
from aicf_tvm.core.contract import ContractFacts, EmitContract, PortFacts
from aicf_tvm.core.lattice import (
    ABIFact,
    AccumDtype,
    Alias,
    Alignment,
    Determinism,
    Effect,
    MathTag,
    NumericFact,
    Rounding,
    ShapeFact,
)

from . import strategies as S
from .lattice_laws import LatticeLaws


class TestEffectLaws(LatticeLaws):
    values = S.effects


class TestAliasLaws(LatticeLaws):
    values = S.aliases


class TestMathTagLaws(LatticeLaws):
    values = S.math_tags


class TestAccumDtypeLaws(LatticeLaws):
    values = S.enum_values(AccumDtype)


class TestNumericLaws(LatticeLaws):
    values = S.numerics


class TestAlignmentLaws(LatticeLaws):
    values = S.alignments


class TestABILaws(LatticeLaws):
    values = S.abis


class TestShapeLaws(LatticeLaws):
    values = S.shapes()


class TestPortFactsLaws(LatticeLaws):
    values = S.ports


class TestContractFactsLaws(LatticeLaws):
    values = S.contract_facts
    has_bottom = False  # infinitely many port names: no finite ⊥


class TestEmitContractLaws(LatticeLaws):
    values = S.contracts
    has_bottom = False


def test_effect_is_a_diamond():
    none, read, write, rw = (Effect(v) for v in ("None", "Read", "Write", "ReadWrite"))
    assert read.join(write) == rw and read.meet(write) == none
    assert not read.leq(write) and not write.leq(read)
    assert [e.rank for e in (none, read, write, rw)] == [0, 1, 2, 3]


def test_alias_order_and_contradiction_value():
    must, no, may, unk = (Alias(v) for v in ("MustAlias", "NoAlias", "MayAlias", "Unknown"))
    assert must.leq(may) and no.leq(may) and may.leq(unk)
    assert must.join(no) == may
    assert must.meet(no) == Alias.bottom()


def test_alias_refine_raises_naming_both_sources():
    with pytest.raises(AliasContradiction, match=r"frontend.*MustAlias.*PropagateContracts.*NoAlias"):
        Alias("MustAlias").refine(Alias("NoAlias"), "frontend", "PropagateContracts")
    with pytest.raises(AliasContradiction, match=r"b_src says MustAlias but a_src says NoAlias"):
        Alias("NoAlias").refine(Alias("MustAlias"), "a_src", "b_src")
    assert Alias("NoAlias").refine(Alias("MayAlias"), "a", "b") == Alias("NoAlias")


def test_accumulation_wider_is_stronger():
    f64, f32, f16, bf16 = (AccumDtype(v) for v in ("float64", "float32", "float16", "bfloat16"))
    assert f64.leq(f32) and f32.leq(f16) and f32.leq(bf16)
    assert not f16.leq(f32)
    assert f16.join(bf16) == AccumDtype.top() and f16.meet(bf16) == f32


def test_math_tag_named_approximations_are_incomparable():
    a, b = MathTag("approx:fast_exp"), MathTag("approx:fast_tanh")
    assert MathTag("exact").leq(a) and a.leq(MathTag("approx"))
    assert not a.leq(b) and a.join(b) == MathTag("approx") and a.meet(b) == MathTag("exact")


def test_numeric_exact_is_strongest_for_its_dtype():
    exact32 = NumericFact.exact("float32")
    assert exact32.leq(NumericFact.top())
    assert exact32.determinism == Determinism.bottom() and exact32.rounding == Rounding.bottom()
    assert not NumericFact.exact("float16").leq(exact32)


def test_alignment_larger_is_stronger():
    assert Alignment(64).leq(Alignment(16)) and not Alignment(1).leq(Alignment(16))
    with pytest.raises(ValueError):
        Alignment(24)


def test_shape_levels():
    top, rank, shape = ShapeFact.top(), ShapeFact.rank(2), ShapeFact.shape([4, "n"])
    strided = ShapeFact.contiguous([4, "n"])
    assert strided.leq(shape) and shape.leq(rank) and rank.leq(top)
    assert not rank.leq(shape)
    assert strided.strides == ("n", 1) and strided.is_contiguous()
    transposed = ShapeFact((4, "n"), (1, 4))
    assert not transposed.is_contiguous()
    assert ShapeFact.shape([4, None]).meet(ShapeFact.shape([None, 5])) == ShapeFact.shape([4, 5])
    assert ShapeFact.shape([4]).meet(ShapeFact.shape([5])).is_bottom
    assert ShapeFact.rank(1).meet(ShapeFact.rank(2)).is_bottom


def test_layout_any_is_top_and_distinct_layouts_are_incomparable():
    """``None`` ("any layout") is ⊤ of the layout component; a blocked fact entails only a
    requirement of that layout or of any layout; two layouts meet at ⊥ (no tensor is both)."""
    dims = (1, 4, 7, 7, 16)
    blocked = ShapeFact.contiguous(dims).with_layout("NCHW16c")
    assert blocked.leq(ShapeFact.shape(dims)) and blocked.leq(ShapeFact.top())
    assert blocked.leq(ShapeFact.top().with_layout("NCHW16c"))
    assert not ShapeFact.contiguous(dims).leq(ShapeFact.top().with_layout("NCHW16c"))
    assert not blocked.leq(ShapeFact.top().with_layout("NCHW8c"))
    assert blocked.meet(ShapeFact.top().with_layout("NCHW8c")).is_bottom
    assert blocked.join(blocked.with_layout("NCHW8c")) == ShapeFact.contiguous(dims)
    assert ShapeFact.from_json(blocked.to_json()) == blocked
    assert blocked.show() == "[1x4x7x7x16] contiguous NCHW16c"


def test_symbolic_row_major_strides_are_canonical():
    fact = ShapeFact.contiguous(["n", 12, 64])
    assert fact.strides == (768, 64, 1)
    assert ShapeFact.contiguous([2, "n", 3]).strides == ("3*n", 3, 1)


def test_abi_product_order():
    strong = ABIFact(Alignment(64))
    assert strong.leq(ABIFact()) and not ABIFact().leq(strong)


def test_port_facts_missing_means_top():
    x = ContractFacts.of({"x": PortFacts(effect=Effect("Read"))})
    assert x.port("y") == PortFacts()
    assert x.join(ContractFacts()) == ContractFacts()
    assert x.meet(ContractFacts()) == x
    assert EmitContract(provides=x).leq(EmitContract())
