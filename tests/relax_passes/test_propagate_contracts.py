"""PropagateContracts: per-site facts joined into each Emit's contract, assertions met.

The facts per value are the analysis' (``tests/aicf_tvm/test_propagation.py``); these
cases check what the pass stores.
"""

from __future__ import annotations

import pytest
import tvm
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from tvm import relax

from aicf_tvm import (
    EMIT_ATTR,
    AliasContradiction,
    ContractContradiction,
    Emit,
    emit_of,
    verify_contracts,
)
from aicf_tvm.core.contract import ContractFacts, PortFacts
from aicf_tvm.core.kinds import views
from aicf_tvm.core.lattice import ABIFact, Alias, Alignment, ShapeFact
from relax_passes import LiftEmits, PropagateContracts

from ..aicf_tvm.core.strategies import extents
from ..aicf_tvm.core.test_propagation import SameValueTwice, Views


def test_alias_facts_of_call_sites():
    mod = PropagateContracts()(LiftEmits()(Views))
    verify_contracts(mod)
    add = emit_of(mod["emit_add"]).contract.provides
    assert add.alias_of("x1", "x2") == Alias("NoAlias")  # g is a fresh buffer, y the caller's
    assert add.alias_of("x1", "out") == Alias("NoAlias")
    perm = emit_of(mod["emit_permute_dims"]).contract.provides
    assert perm.alias_of("x", "out") == Alias("MayAlias")  # a view may share storage


def test_contract_of_an_emit_called_twice_is_the_join_of_its_sites():
    """x*x MustAlias, x*y Unknown: the contract keeps what both sites guarantee."""
    mod = PropagateContracts()(LiftEmits()(SameValueTwice))
    joined = emit_of(mod["emit_multiply"]).contract.provides
    assert joined.alias_of("x1", "x2") == Alias("Unknown")


def _assert_facts(mod, name, asserted: ContractFacts):
    emit = emit_of(mod[name])
    new = Emit(emit.kind, emit.attrs, emit.interface, emit.contract, emit.math, emit.op, asserted)
    mod[name] = mod[name].with_attr(EMIT_ATTR, new.to_attr())
    return mod


def test_asserted_shape_contradicting_propagation_raises():
    mod = LiftEmits()(SameValueTwice)
    wrong = ContractFacts.of({"out": PortFacts(shape=ShapeFact.shape([5]))})
    with pytest.raises(ContractContradiction, match=r"emit_multiply.*port out.*\[5\].*\[4\]"):
        PropagateContracts()(_assert_facts(mod, "emit_multiply", wrong))


def test_asserted_facts_are_kept_when_consistent():
    mod = LiftEmits()(SameValueTwice)
    aligned = ContractFacts.of({"x1": PortFacts(abi=ABIFact(Alignment(64)))})
    out = PropagateContracts()(_assert_facts(mod, "emit_multiply", aligned))
    assert emit_of(out["emit_multiply"]).contract.provides.port("x1").abi.alignment == Alignment(64)


def test_alias_assertion_contradicting_propagation_raises_naming_both():
    mod = LiftEmits()(Views)
    must = ContractFacts.of(alias={("x1", "out"): Alias("MustAlias")})
    with pytest.raises(AliasContradiction, match="assertion on emit_add says MustAlias but propagated"):
        PropagateContracts()(_assert_facts(mod, "emit_add", must))


def test_idempotent():
    once = PropagateContracts()(LiftEmits()(Views))
    tvm.ir.assert_structural_equal(PropagateContracts()(once), once)


def test_module_without_emits_is_unchanged():
    mod = Views
    tvm.ir.assert_structural_equal(PropagateContracts()(mod), mod)


class _Call:
    """A stand-in call carrying only what the view rules read."""

    def __init__(self, **attrs):
        self.attrs = type("A", (), attrs)()
        self.args = attrs.get("args", ())


# An unknown input stride (None) is taken for an inserted axis and given a row-major stride.
_VIEW_CASES = [
    (views.permute_dims, _Call(axes=[1, 0]), (3, 2)),
    (views.reshape, _Call(), (6,)),
    (views.squeeze, _Call(axis=None), (2, 3)),
    # an unknown input stride stays unknown: [2, 3] strides (?, 1) is not made contiguous
    (views.expand_dims, _Call(axis=[0]), (1, 2, 3)),
    (views.broadcast_to, _Call(), (4, 2, 3)),
]


@st.composite
def _stronger_and_weaker(draw) -> tuple[ShapeFact, ShapeFact]:
    """Two facts about the [2, 3] input the rules are given, the first ⊑ the second: the
    weaker has its extents known or not and any strides; the stronger makes some of its
    unknown extents known (as 2 and 3: facts hold of the one tensor) and unknown strides
    known. Valid by construction, unlike ``a.meet(b)`` of independent draws (95% ⊥, of
    another rank, or not of a [2, 3] tensor)."""
    weaker = ShapeFact(draw(st.sampled_from([(2, 3), (None, None)])), draw(st.none() | st.tuples(extents, extents)))
    dims = tuple(d if d is not None else draw(st.sampled_from([None, true]))
                 for d, true in zip(weaker.dims, (2, 3)))
    strides = tuple(s if s is not None else draw(extents) for s in weaker.strides or (None, None))
    return ShapeFact(dims, strides), weaker


@pytest.mark.parametrize("rule,call,out_dims", _VIEW_CASES)
def test_view_stride_rules_are_monotone(rule, call, out_dims):
    """A stronger input fact never gives a weaker output stride fact."""

    @settings(max_examples=80, deadline=None)
    @given(_stronger_and_weaker())
    @example((ShapeFact((None, None), (1, 1)), ShapeFact((None, None), (None, 1))))  # see _EXPAND_DIMS_BUG
    def check(pair):
        lo, hi = pair
        assert not lo.is_bottom and lo.leq(hi)  # the strategy's promise, not the property
        event(f"input {hi.show()}, refined {'to ' + lo.show() if lo != hi else 'not at all'}"[:60])

        def out(f):
            return ShapeFact(out_dims, rule(call, [f], out_dims))

        assert out(lo).leq(out(hi))

    check()


def test_relax_rejects_nothing_we_built():
    mod = PropagateContracts()(LiftEmits()(Views))
    assert relax.analysis.check_well_formed(mod)
