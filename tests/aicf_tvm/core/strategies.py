"""Hypothesis strategies for lattice values, shared by the law and contract tests."""

from __future__ import annotations

from hypothesis import strategies as st

from aicf_tvm.core.contract import ContractFacts, EmitContract, PortFacts
from aicf_tvm.core.lattice import (
    ABIFact,
    AccumDtype,
    Alias,
    Alignment,
    Determinism,
    Effect,
    Flag,
    MathTag,
    NumericFact,
    Rounding,
    ShapeFact,
)


def enum_values(cls):
    return st.sampled_from(cls.all())


effects = enum_values(Effect)
aliases = enum_values(Alias)
math_tags = st.sampled_from(["exact", "approx", "approx:fast_exp", "approx:fast_tanh"]).map(MathTag)
numerics = st.builds(NumericFact, math_tags, enum_values(AccumDtype), enum_values(Determinism), enum_values(Rounding))
alignments = st.sampled_from([1, 4, 16, 64, 4096]).map(Alignment)
abis = st.builds(ABIFact, alignments, enum_values(Flag), enum_values(Flag))

extents = st.one_of(  # a dim or a stride: unknown, static or symbolic
    st.none(), st.sampled_from([1, 2, 3, 768]), st.sampled_from(["n", "m"]))


layouts = st.sampled_from([None, None, "NCHW16c", "NCHW8c"])  # None: ⊤, any layout


@st.composite
def shapes(draw):
    """Any shape fact: top, bottom, rank only, dims, or dims with strides (rank 0 to 2),
    each with any layout component."""
    kind = draw(st.sampled_from(["top", "bottom", "rank", "dims", "strided"]))
    if kind == "bottom":
        return ShapeFact.bottom()
    layout = draw(layouts)
    if kind == "top":
        return ShapeFact.top().with_layout(layout)
    r = draw(st.integers(0, 2))
    if kind == "rank":
        return ShapeFact.rank(r).with_layout(layout)
    dims = tuple(draw(extents) for _ in range(r))
    if kind == "dims":
        return ShapeFact(dims, layout=layout)
    return ShapeFact(dims, tuple(draw(extents) for _ in range(r)), layout=layout)


ports = st.builds(PortFacts, effects, shapes(), numerics, abis)
_names = st.sampled_from(["x", "y", "out"])
contract_facts = st.builds(
    ContractFacts.of,
    st.dictionaries(_names, ports, max_size=2),
    st.dictionaries(st.tuples(_names, _names), aliases, max_size=2),
)
contracts = st.builds(EmitContract, contract_facts, contract_facts)
