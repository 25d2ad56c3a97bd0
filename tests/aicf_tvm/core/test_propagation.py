"""The contract analysis: the fact of every tagged value, tuple facts, per-site alias facts.

Like MLIR's dataflow tests: each case names values and checks the lattice value
propagated to each, with the reason it is right.
"""

from __future__ import annotations

import pytest
from tvm.script import ir as I
from tvm.script import relax as R

from aicf_tvm.core.contract import PortFacts
from aicf_tvm.core.facts import TensorFact, TupleFact
from aicf_tvm.core.lattice import Alias, MathTag, ShapeFact
from aicf_tvm.core.propagation import analyze
from relax_passes import LiftEmits


@I.ir_module
class Views:
    @R.function
    def main(x: R.Tensor(("n", 16, 8), "float32"), y: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            t = R.permute_dims(x, [0, 2, 1])
            r = R.reshape(x, R.shape([x.ty.shape[0] if False else 0, 128]) if False else (-1, 128))
            rt = R.reshape(t, (-1, 128))
            s0 = R.strided_slice(y, axes=[0], begin=[1], end=[3])
            s1 = R.strided_slice(y, axes=[1], begin=[0], end=[8], strides=[2])
            b = R.broadcast_to(R.expand_dims(y, [0]), (3, 4, 8))
            g = R.nn.gelu_tanh(y)
            a = R.add(g, y)
            R.output(t, r, rt, s0, s1, b, a)
        return (t, r, rt, s0, s1, b, a)


@pytest.fixture(scope="module")
def facts():
    mod = LiftEmits()(Views)
    table = analyze(mod)
    return {v.name: f for v, f in table.values.items() if isinstance(f, TensorFact)}


def test_permute_dims_output_is_strided_and_not_contiguous(facts):
    # x is [n,16,8] row-major: strides (128, 8, 1); swapping the last two axes.
    t = facts["t"].facts.shape
    assert t.dims == ("n", 8, 16) and t.strides == (128, 1, 8)
    assert not t.is_contiguous()


def test_reshape_of_contiguous_stays_contiguous_and_symbolic_dim_survives(facts):
    r = facts["r"].facts.shape
    assert r.is_contiguous() and r.dims[1] == 128 and isinstance(r.dims[0], str)


def test_reshape_of_transposed_view_has_unknown_strides(facts):
    rt = facts["rt"].facts.shape
    assert rt.strides is None and not rt.is_contiguous()


def test_slices_outer_axis_contiguous_inner_axis_strided(facts):
    assert facts["s0"].facts.shape == ShapeFact((2, 8), (8, 1))  # rows of a contiguous matrix
    s1 = facts["s1"].facts.shape
    assert s1 == ShapeFact((4, 4), (8, 2)) and not s1.is_contiguous()


def test_broadcast_gives_zero_strides(facts):
    assert facts["b"].facts.shape.strides == (0, 8, 1)


def test_approximate_math_propagates_to_consumers(facts):
    assert facts["g"].facts.numeric.math == MathTag("approx:gelu_tanh")
    assert facts["a"].facts.numeric.math == MathTag("approx:gelu_tanh")  # add itself is exact


@I.ir_module
class SameValueTwice:
    @R.function
    def main(x: R.Tensor((4,), "float32"), y: R.Tensor((4,), "float32")):
        with R.dataflow():
            a = R.multiply(x, x)
            b = R.multiply(x, y)
            R.output(a, b)
        return (a, b)


def test_same_value_must_alias_and_two_caller_inputs_unknown():
    table = analyze(LiftEmits()(SameValueTwice))
    [sites] = table.sites.values()
    assert sites[0].alias_of("x1", "x2") == Alias("MustAlias")
    assert sites[1].alias_of("x1", "x2") == Alias("Unknown")


@I.ir_module
class Tuples:
    @R.function
    def main(x: R.Tensor((4, 6), "float32"), pair: R.Tuple(R.Tensor((4, 3), "float32"), R.Tensor((4, 3), "float32"))):
        with R.dataflow():
            halves = R.split(x, 2, axis=1)
            lo = halves[0]
            hi = halves[1]
            both = (lo, (hi, x))
            inner = both[1]
            again = inner[1]
            t = R.add(again, x)
            p0 = pair[0]
            p1 = pair[1]
            s = R.add(p0, p1)
            R.output(halves, both, t, s)
        return (halves, both, t, s)


CALLEE = {"t": "emit_add", "s": "emit_add1"}  # as LiftEmits names them, in program order


@pytest.fixture(scope="module")
def tuples():
    """The analysis of ``Tuples`` and its values by name (parameters included)."""
    main = LiftEmits()(Tuples)
    table = analyze(main)
    named = {p.name: p for p in main["main"].params}
    named |= {b.var.name: b.var for b in main["main"].body.blocks[0].bindings}
    return table, named


def site_of(table, name: str):
    """The facts of the one Emit call that binds ``name`` (each add has its own Emit: the
    shapes differ)."""
    [site] = [s for gv, sites in table.sites.items() for s in sites if gv.name_hint == CALLEE[name]]
    return site


def test_a_multi_output_emit_gives_a_tuple_fact_of_fresh_row_major_items(tuples):
    """split writes two new [4, 3] buffers: each item is its own row-major tensor."""
    table, var = tuples
    halves = table.of(var["halves"])
    assert isinstance(halves, TupleFact) and len(halves.fields) == 2
    for item in halves.fields:
        assert isinstance(item, TensorFact) and item.facts.shape == ShapeFact((4, 3), (3, 1))
    assert table.of(var["lo"]) is halves.fields[0]  # a tuple read is the item's own fact


def test_tensor_accessor_answers_none_for_a_tuple_and_port_facts_top(tuples):
    table, var = tuples
    assert table.tensor(var["halves"]) is None and table.port_facts(var["halves"]) == PortFacts()
    assert table.tensor(var["lo"]) is table.of(var["lo"])


def test_nested_tuple_fact_lists_its_buffers_in_field_order(tuples):
    table, var = tuples
    both = table.of(var["both"])
    assert isinstance(both, TupleFact) and isinstance(both.fields[1], TupleFact)
    assert both.tensors() == (table.of(var["lo"]), table.of(var["hi"]), table.of(var["x"]))


def test_items_of_a_caller_tuple_are_caller_inputs(tuples):
    """The caller may pass one buffer as both items: their alias is Unknown, not NoAlias."""
    table, var = tuples
    assert table.of(var["p0"]).from_caller and table.of(var["p1"]).from_caller
    assert site_of(table, "s").alias_of("x1", "x2") == Alias("Unknown")


def test_an_item_of_a_nested_tuple_is_the_buffer_put_there(tuples):
    """``both[1][1]`` is ``x`` itself: it holds x's buffer (never a fresh one), so at
    ``add(again, x)`` the two ports may alias (they do: MustAlias at run time)."""
    table, var = tuples
    assert table.of(var["again"]) is table.of(var["x"])
    assert site_of(table, "t").alias_of("x1", "x2") == Alias("MayAlias")
