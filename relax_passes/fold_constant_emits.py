"""FoldConstantEmits: do at compile time the work that needs only constants
(docs/design.md §6), the second job of MaterializeEmits.

An effect-free single-op Emit whose inputs are all constants (a weight transposed for a
GEMM, a broadcast mask) becomes its op on those constants, which TVM's ``FoldConstant``
evaluates now with the op's own legalization (``FoldConstantIEEE``: rank-0 float
constants as buffers), so no kernel runs per inference.

Sound: folding evaluates the same op on the same constants.
"""

from __future__ import annotations

import tvm
from tvm import relax

from aicf_tvm.core.emit_graph import EmitGraph
from aicf_tvm.core.facts import FactTable
from aicf_tvm.core.report import Decision, FusionReport

from .emit_rewrite import EmitRewrite
from .group_rewrite import drop_unused_emits
from .ieee_fold import FoldConstantIEEE
from .narrow_constants import widens


def _is_constant(expr: relax.Expr) -> bool:
    return isinstance(expr, tvm.ir.Constant)


def _feeds_matmul(graph: EmitGraph, node) -> bool:
    """``node``'s value is a ``matmul`` operand, directly or through ``permute_dims``."""
    for index in node.consumers:
        consumer = graph.nodes[index]
        op = consumer.body.op.name if consumer.body is not None else ""
        if op == "relax.matmul" or (op == "relax.permute_dims" and _feeds_matmul(graph, consumer)):
            return True
    return False


def fold_constant_emits(graph: EmitGraph, mod: tvm.IRModule, bindings: list, report: FusionReport) -> bool:
    """Replace in ``bindings`` (the block's, or what an earlier job made of them) each call
    of an effect-free single-op Emit on constants only, still as ``graph`` has it, by its op
    on those constants, for ``FoldConstantIEEE`` to evaluate; whether one was."""
    changed = False
    for k, b in enumerate(bindings):
        node = graph.node_of(b.var)
        if node is None or not b.same_as(graph.block.bindings[node.index]):
            continue
        args = list(node.value.args) if isinstance(node.value, relax.Call) else []
        pure = node.emit is not None and not node.is_opaque and all(
            not node.emit.contract.provides.port(p.name).effect.writes for p in node.emit.interface.inputs)
        if pure and node.body is not None and all(_is_constant(a) for a in args):  # no args: creation
            sub = dict(zip(mod[node.callee].params, args))
            call = relax.Call(node.body.op, [sub.get(a, a) for a in node.body.args], node.body.attrs,
                              node.body.ty_args)
            if widens(call) and _feeds_matmul(graph, node):  # relax_passes.narrow_constants
                continue
            bindings[k] = relax.VarBinding(b.var, call)
            report.add(Decision(f"materialize:{node.emit.kind}", (node.var.name,), True,
                                note="inputs are constants: computed at compile time"))
            changed = True
    return changed


def fold_and_tidy(mod: tvm.IRModule) -> tvm.IRModule:
    """What the materializing passes end with: the folds evaluated, bindings
    canonicalized, the Emit functions no longer called dropped."""
    out = FoldConstantIEEE()(mod)
    return drop_unused_emits(relax.transform.CanonicalizeBindings()(out))


@tvm.transform.module_pass(opt_level=0, name="FoldConstantEmits")
class FoldConstantEmits(EmitRewrite):
    """Compute the constant-only Emits of ``main`` at compile time; report each."""

    def rewrite_block(self, bb: relax.BlockBuilder, graph: EmitGraph,
                      facts: FactTable) -> relax.DataflowBlock | None:
        bindings = list(graph.block.bindings)
        folded = fold_constant_emits(graph, graph.mod, bindings, self.report)
        return relax.DataflowBlock(bindings) if folded else None

    def finish(self, mod: tvm.IRModule) -> tvm.IRModule:
        return fold_and_tidy(mod)


__all__ = ["FoldConstantEmits", "fold_and_tidy", "fold_constant_emits"]
