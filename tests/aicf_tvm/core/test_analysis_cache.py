"""The analysis as a cached result (``analysis_of``), typed roots, read-only fact tables.

The cache must give exactly what ``analyze`` gives: reused while the function and every
Emit function it calls are the same objects, recomputed when either changed.
"""

from __future__ import annotations

import pytest
import tvm
from tvm import relax

from aicf_tvm.core import propagation
from aicf_tvm.core.contract import ContractFacts, PortFacts
from aicf_tvm.core.emit import EMIT_ATTR, emit_of
from aicf_tvm.core.facts import ConstRoot, ParamRoot, ValueRoot, constant_fact
from aicf_tvm.core.lattice import Effect
from aicf_tvm.core.propagation import analysis_of, analyze, clear_analysis_cache
from relax_passes import FuseEmits, LiftEmits

from ...relax_passes.test_fuse_emits import GemmBiasRelu


@pytest.fixture
def runs(monkeypatch):
    """How many times the analysis really ran since the test started (cache emptied)."""
    clear_analysis_cache()
    count = [0]
    run = propagation._Analysis.run

    def counted(self):
        count[0] += 1
        return run(self)

    monkeypatch.setattr(propagation._Analysis, "run", counted)
    yield count
    clear_analysis_cache()


def test_an_unchanged_function_is_not_analyzed_again(runs):
    """The same function and callees, even in another module object, hit the cache."""
    mod = LiftEmits()(GemmBiasRelu)
    table = analysis_of(mod)
    assert analysis_of(mod) is table
    assert analysis_of(tvm.IRModule(dict(mod.functions_items()))) is table
    assert runs[0] == 1


def test_a_changed_function_is_analyzed_again(runs):
    """FuseEmits makes a new ``main``: its table is computed afresh and equals ``analyze``'s."""
    mod = LiftEmits()(GemmBiasRelu)
    before = analysis_of(mod)
    fused = FuseEmits()(mod)
    after = analysis_of(fused)
    assert runs[0] == 2 and after is not before
    assert dict(after.sites) == dict(analyze(fused).sites)


def test_a_changed_callee_alone_invalidates_the_table(runs):
    """A callee's contract feeds the transfer rule (its stated numerics and layout), so a
    new Emit function under the same ``main`` means a new analysis."""
    mod = LiftEmits()(GemmBiasRelu)
    analysis_of(mod)
    gv = next(gv for gv, f in mod.functions_items() if gv.name_hint != "main")
    func = mod[gv]
    changed = tvm.IRModule(dict(mod.functions_items()))
    changed[gv] = func.with_attr(EMIT_ATTR, emit_of(func).to_attr())  # equal, but a new object
    assert changed["main"].same_as(mod["main"])
    analysis_of(changed)
    assert runs[0] == 2


def test_the_table_is_read_only():
    table = analysis_of(LiftEmits()(GemmBiasRelu))
    var = next(iter(table.values))
    with pytest.raises(TypeError):
        table.values[var] = table.values[var]
    with pytest.raises(TypeError):
        table.sites[next(iter(table.sites))] = ()


def test_roots_are_equal_when_they_name_the_same_buffer():
    """A root names a buffer by the parameter's index and item path, by the Constant, or by
    the bound Var: the same object is the same root however Python wraps it."""
    assert ParamRoot(0).item(1) == ParamRoot(0, (1,)) != ParamRoot(0)
    assert ParamRoot(1) != ParamRoot(0)
    mod = LiftEmits()(GemmBiasRelu)
    a = mod["main"].body.blocks[0].bindings[0].var
    b = mod["main"].body.blocks[0].bindings[0].var  # another Python object, the same Var
    other = mod["main"].body.blocks[0].bindings[1].var
    assert a is not b and ValueRoot(a) == ValueRoot(b) and hash(ValueRoot(a)) == hash(ValueRoot(b))
    assert ValueRoot(a) != ValueRoot(other)
    c = relax.const(1.0, "float32")
    assert constant_fact(c).roots == frozenset({ConstRoot(c)})
    assert ConstRoot(c) != ConstRoot(relax.const(1.0, "float32"))  # two constants, two buffers
    assert len({ParamRoot(0), ValueRoot(a), ConstRoot(c), ParamRoot(0)}) == 3


def test_contract_facts_hold_their_ports_as_a_mapping():
    read = PortFacts(effect=Effect("Read"))
    facts = ContractFacts.of({"x": read, "y": PortFacts()})
    assert dict(facts.port_map) == {"x": read}  # ⊤ entries are dropped, as in ``ports``
    assert facts.port("x") is read and facts.port("y") == PortFacts()
    with pytest.raises(TypeError):
        facts.port_map["x"] = read  # type: ignore[index]
