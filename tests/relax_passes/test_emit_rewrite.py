"""EmitRewrite: the shared walk of the Emit passes, on tiny passes written for the test."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from aicf_tvm import emit_of, verify_contracts
from aicf_tvm.core.contract import EmitContract
from aicf_tvm.core.emit import Emit, Interface, Port
from aicf_tvm.core.report import Decision
from relax_passes import LiftEmits, PropagateContracts
from relax_passes.emit_rewrite import EmitRewrite
from relax_passes.group_rewrite import Group

from ..conftest import run_vm


@I.ir_module
class ReluExpNeg:
    @R.function
    def main(x: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            a = R.nn.relu(x)
            b = R.exp(a)
            c = R.negative(b)
            R.output(c)
        return c


def lifted() -> tvm.IRModule:
    return PropagateContracts()(LiftEmits()(ReluExpNeg))


def _pair_emit(inputs, outputs, graph) -> Emit:
    ins = tuple(Port(f"in{i}", str(a.ty.dtype), a.ty.ndim) for i, a in enumerate(inputs))
    outs = tuple(Port("out", str(graph.nodes[i].var.ty.dtype), graph.nodes[i].var.ty.ndim) for i in outputs)
    return Emit("fused_elementwise", {}, Interface(ins, outs), EmitContract(), op="")


@tvm.transform.module_pass(opt_level=0, name="FuseFirstPair")
class FuseFirstPair(EmitRewrite):
    """Plans the block's first two bindings as one group and reports it."""

    def plan(self, graph, facts):
        assert all(facts.tensor(n.var) is not None for n in graph.nodes)  # the walk hands the facts
        self.report.add(Decision("fused_pair", (graph.nodes[0].var.name, graph.nodes[1].var.name), True))
        return [Group([0, 1], "fused_pair", make_emit=_pair_emit)]


@tvm.transform.module_pass(opt_level=0, name="PlanNothing")
class PlanNothing(EmitRewrite):
    def plan(self, graph, facts):
        return []


@tvm.transform.module_pass(opt_level=0, name="DropFirstDead")
class DropFirstDead(EmitRewrite):
    """Removes the first unused binding of the block per walk (one per sweep)."""

    sweeps = 8

    def rewrite_block(self, bb, graph, facts):
        self.walks = getattr(self, "walks", 0) + 1
        dead = next((n.index for n in graph.nodes if not n.consumers and not n.escapes), None)
        if dead is None:
            return None
        return relax.DataflowBlock([b for i, b in enumerate(graph.block.bindings) if i != dead])


def kinds(mod: tvm.IRModule) -> list[str]:
    return sorted(emit_of(f).kind for _, f in mod.functions_items()
                  if isinstance(f, relax.Function) and emit_of(f) is not None)


def test_plan_groups_are_rewritten_into_one_emit():
    """relu and exp become one Emit (``fused_elementwise``); their old Emit functions go (finish),
    the report holds the decision, and the module computes what it did."""
    before = lifted()
    p = FuseFirstPair()
    after = PropagateContracts()(p(before))
    verify_contracts(after)
    assert kinds(after) == ["fused_elementwise", "negative"]
    assert [d.candidate for d in p.report.decisions] == ["fused_pair"]
    x = np.random.default_rng(0).standard_normal((4, 8)).astype("float32")
    np.testing.assert_allclose(run_vm(after, x)[0], run_vm(before, x)[0], rtol=1e-6)


def test_no_decision_returns_the_same_module():
    """A walk that changes no block hands back the module itself (so its cached facts hold)."""
    before = lifted()
    assert PlanNothing()(before).same_as(before)


def test_sweeps_repeat_while_the_walk_changes_something():
    """Each walk drops one dead binding; the walk is repeated until one changes nothing."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            bb.emit(relax.op.exp(x))
            bb.emit(relax.op.negative(x))
            out = bb.emit_output(relax.op.nn.relu(x))
        bb.emit_func_output(out)
    p = DropFirstDead()
    after = p(LiftEmits()(bb.get()))
    assert len(after["main"].body.blocks[0].bindings) == 1
    assert p.walks == 3  # two removals, then a walk that finds nothing


def test_a_module_without_the_function_is_left_alone():
    mod = lifted()
    assert PlanNothing(func_name="absent")(mod).same_as(mod)
