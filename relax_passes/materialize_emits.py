"""MaterializeEmits: do at compile time the work an Emit needs only constants for.

An effect-free single-op Emit whose inputs are all constants (a weight transposed
for a GEMM, a bias broadcast or reshaped for a convolution) is evaluated now, so the
transposed / reshaped weight is a constant and no kernel runs per inference: the
weight arrives in the layout the fused kernel requires. Sound because such an Emit
depends on nothing but its constant inputs and writes nothing else; TVM's
``FoldConstant`` evaluates it with the op's own legalization.
Runs after FuseEmits in the pipeline's fixpoint; re-propagate afterwards.
"""

from __future__ import annotations

import tvm
from tvm import relax

from aicf_tvm.emit_graph import EmitGraph
from aicf_tvm.report import Decision, FusionReport

from .group_rewrite import drop_unused_emits


def _is_constant(expr) -> bool:
    return isinstance(expr, tvm.ir.Constant)


@tvm.transform.module_pass(opt_level=0, name="MaterializeEmits")
class MaterializeEmits:
    """Fold constant-only Emits of ``main`` into constants; decisions go to the report."""

    def __init__(self, report: FusionReport | None = None, func_name: str = "main") -> None:
        self.report = report if report is not None else FusionReport()
        self.func_name = func_name

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        if self.func_name not in [gv.name_hint for gv in mod.get_global_vars()]:
            return mod
        func = mod[self.func_name]
        blocks, changed, cache = [], False, {}
        for block in func.body.blocks:
            if not isinstance(block, relax.DataflowBlock):
                blocks.append(block)
                continue
            graph = EmitGraph(mod, block, cache)
            bindings = []
            for node in graph.nodes:
                b = block.bindings[node.index]
                args = list(node.value.args) if isinstance(node.value, relax.Call) else []
                pure = node.emit is not None and not node.is_opaque and all(
                    not node.emit.contract.provides.port(p.name).effect.writes for p in node.emit.interface.inputs)
                if pure and node.body is not None and args and all(_is_constant(a) for a in args):
                    sub = dict(zip(mod[node.callee].params, args))
                    call = relax.Call(node.body.op, [sub.get(a, a) for a in node.body.args], node.body.attrs,
                                      node.body.ty_args)
                    bindings.append(relax.VarBinding(b.var, call))
                    self.report.add(Decision(f"materialize:{node.emit.kind}", (node.var.name,), True,
                                             note="inputs are constants: computed at compile time"))
                    changed = True
                else:
                    bindings.append(b)
            blocks.append(relax.DataflowBlock(bindings))
        if not changed:
            return mod
        bb = relax.BlockBuilder(mod)
        new_func = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                                  func.is_pure, func.attrs)
        bb.update_func(mod.get_global_var(self.func_name), bb.normalize(new_func))
        out = relax.transform.FoldConstant()(bb.get())
        return drop_unused_emits(relax.transform.CanonicalizeBindings()(out))
