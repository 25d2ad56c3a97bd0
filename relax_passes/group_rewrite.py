"""Replace groups of Emit calls by calls of one new Emit function each.

Shared by the rewriting passes (``EmitRewrite.plan`` returns the groups). A group's
function takes the group's boundary inputs, inlines each member's body in program order
(so it computes exactly what the members did), and returns every member value needed
outside the group. The block is then re-emitted in a topological order of groups and
remaining bindings.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.relax.utils import copy_with_new_vars

from aicf_tvm.core.emit import EMIT_ATTR, Emit
from aicf_tvm.core.emit_graph import EmitGraph, Node

from .lift_emits import param_types

# ops whose accumulator a group may widen (``Group.accumulation``)
ACCUMULATING = {"relax.matmul", "relax.nn.conv2d"}


@dataclass
class Group:
    """A set of nodes to become one Emit, with the Emit that describes it."""

    members: list[int]
    name: str  # function name hint
    make_emit: Any = None  # (inputs, outputs, graph) -> Emit, set by the planner
    accumulation: str | None = None


def group_inputs(graph: EmitGraph, members: list[int]) -> list[relax.Expr]:
    """Boundary tensor inputs of a group, in first-use order, without duplicates."""
    inside = {graph.nodes[i].var for i in members}
    out: list[relax.Expr] = []
    for i in members:
        for arg in graph.nodes[i].value.args:
            if isinstance(arg, relax.ShapeExpr):  # a view op's target shape
                continue
            if arg in inside or any(arg.same_as(o) for o in out):
                continue
            out.append(arg)
    return out


def _widened(bb: relax.BlockBuilder, call: relax.Expr, out_dtype: str, acc: str) -> relax.Expr:
    """``call`` recomputed with accumulator ``acc`` and cast back, when it accumulates."""
    if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name in ACCUMULATING):
        return call
    if out_dtype == acc:
        return call
    if call.op.name == "relax.matmul":
        wide = relax.op.matmul(call.args[0], call.args[1], out_dtype=acc)
    else:
        a = call.attrs
        wide = relax.op.nn.conv2d(call.args[0], call.args[1], a.strides, a.padding, a.dilation, a.groups,
                                  a.data_layout, a.kernel_layout, a.out_layout, acc)
    return relax.op.astype(bb.emit(wide), out_dtype)


@mutator
class _Remap(PyExprMutator):
    def __init__(self, remap: dict) -> None:
        super().__init__()
        self.remap = remap

    def visit_var_(self, var: relax.Var) -> relax.Expr:
        return self.remap.get(var, var)

    def visit_dataflow_var_(self, var: relax.Var) -> relax.Expr:
        return self.remap.get(var, var)


def _inline(bb: relax.BlockBuilder, func: relax.Function, args: list[relax.Expr], acc: str | None) -> relax.Expr:
    """Emit the body of ``func`` applied to ``args``; return the value it returns."""
    fresh = copy_with_new_vars(func)
    bound = fresh.bind_params({p: a for p, a in zip(fresh.params, args)})
    remap: dict = {}
    for block in bound.body.blocks:
        for binding in block.bindings:
            value = _Remap(remap).visit_expr(binding.value) if remap else binding.value
            if acc is not None:
                value = _widened(bb, value, str(binding.var.ty.dtype), acc)
            remap[binding.var] = bb.emit(value, name_hint=binding.var.name)
    return remap.get(bound.body.body, bound.body.body)


def build_group_function(graph: EmitGraph, group: Group) -> tuple[relax.Function, list[relax.Expr], list[int]]:
    """The group's function, the arguments to call it with and the members it returns.

    A symbolic var of the caller that the members use (a view's target shape naming
    ``past`` while the inputs only have ``past + 1``) but no parameter defines is passed
    as TVM's FuseOps passes it: a last parameter ``tir_vars: R.Shape([past])``, the call
    giving ``R.shape([past])`` (FuseTIR makes that ``call_tir``'s ``tir_vars``). The
    parameters then keep the caller's extents over those vars, so the body's types are
    the caller's."""
    inputs = group_inputs(graph, group.members)
    outputs = graph.outputs_of(group.members)
    emit: Emit = group.make_emit(inputs, outputs, graph)
    func = _group_function(graph, group, inputs, outputs, emit, [])
    tir_vars = list(relax.analysis.free_symbolic_vars(func))
    if tir_vars:
        func = _group_function(graph, group, inputs, outputs, emit, tir_vars)
        inputs = [*inputs, relax.ShapeExpr(tir_vars)]
    defined = relax.analysis.defined_symbolic_vars(func)
    if defined:
        func = func.bind_symbolic_vars({v: tvm.tirx.Var(v.name, v.ty) for v in defined})
    return func, inputs, outputs


def _group_function(graph: EmitGraph, group: Group, inputs: list[relax.Expr], outputs: list[int], emit: Emit,
                    tir_vars: list[tvm.ir.Expr]) -> relax.Function:
    """The group's function over the caller's vars; ``tir_vars`` (if any) its last parameter."""
    types = param_types([a.ty for a in inputs], defined=tir_vars)
    params = [relax.Var(f"p{i}", ty) for i, ty in enumerate(types)]
    if tir_vars:
        params.append(relax.Var("tir_vars", relax.ShapeType(tir_vars)))
    env: dict[relax.Expr, relax.Expr] = dict(zip(inputs, params))
    bb = relax.BlockBuilder()
    attrs = {"Primitive": True, EMIT_ATTR: emit.to_attr()}
    with bb.function("fused", params, attrs=attrs, private=True):
        with bb.dataflow():
            for i in group.members:
                node = graph.nodes[i]
                args = [_lookup(env, a) for a in node.value.args]
                if node.callee is None:  # a plain Relax view op binding: re-emit it as is
                    v = node.value
                    env[node.var] = bb.emit(relax.Call(v.op, args, v.attrs, v.ty_args), name_hint=node.var.name)
                    continue
                env[node.var] = _inline(bb, graph.mod[node.callee], args, group.accumulation)
            results = [env[graph.nodes[i].var] for i in outputs]
            out = bb.emit_output(results[0] if len(results) == 1 else relax.Tuple(results))
        bb.emit_func_output(out)
    return relax.transform.CanonicalizeBindings()(bb.finalize())["fused"]


def body_at_call_site(mod: tvm.IRModule, node: Node) -> relax.Call:
    """The single op call of ``node``'s Emit applied to the node's arguments, the Emit
    function's symbolic vars replaced by their values at the call (``d0`` by
    ``batch * seq``), so it can be emitted in the caller."""
    func = mod[node.callee]
    bound = func.bind_params(dict(zip(func.params, node.value.args)))
    return next(b for blk in bound.body.blocks for b in blk.bindings).value


def _lookup(env: dict, expr: relax.Expr) -> relax.Expr:
    for k, v in env.items():
        if k.same_as(expr):
            return v
    return expr


def rewrite_block(bb: relax.BlockBuilder, graph: EmitGraph, groups: list[Group]) -> relax.DataflowBlock:
    """The block with each group replaced by one call, in a valid topological order."""
    unit_of: dict[int, int] = {}
    for g_index, g in enumerate(groups):
        for i in g.members:
            unit_of[i] = g_index
    units: dict[Any, list[int]] = {}
    for node in graph.nodes:
        key = ("g", unit_of[node.index]) if node.index in unit_of else ("n", node.index)
        units.setdefault(key, []).append(node.index)
    deps: dict[Any, set] = {k: set() for k in units}
    users: dict[Any, set] = {k: set() for k in units}
    key_of = {i: k for k, members in units.items() for i in members}
    for k, members in units.items():
        for i in members:
            for p in graph.nodes[i].producers:
                if key_of[p] != k:
                    deps[k].add(key_of[p])
                    users[key_of[p]].add(k)
    ready = [(max(m), k) for k, m in units.items() if not deps[k]]
    heapq.heapify(ready)
    bindings: list[Any] = []
    while ready:
        _, k = heapq.heappop(ready)
        if k[0] == "n":
            bindings.append(graph.block.bindings[k[1]])
        else:
            bindings.extend(_group_bindings(bb, graph, groups[k[1]]))
        for u in users[k]:
            deps[u].discard(k)
            if not deps[u]:
                heapq.heappush(ready, (max(units[u]), u))
    assert len(bindings) >= len(graph.nodes) - sum(len(g.members) for g in groups), "cycle in grouping"
    return relax.DataflowBlock(bindings)


def _group_bindings(bb: relax.BlockBuilder, graph: EmitGraph, group: Group) -> list[relax.VarBinding]:
    func, inputs, outputs = build_group_function(graph, group)
    gv = bb.add_func(func, group.name)
    call = bb.normalize(relax.Call(gv, inputs))
    if len(outputs) == 1:
        return [relax.VarBinding(graph.nodes[outputs[0]].var, call)]
    tup = relax.DataflowVar(f"{group.name}_out", call.ty)
    out = [relax.VarBinding(tup, call)]
    for j, i in enumerate(outputs):
        out.append(relax.VarBinding(graph.nodes[i].var, bb.normalize(relax.TupleGetItem(tup, j))))
    return out


def with_blocks(bb: relax.BlockBuilder, mod: tvm.IRModule, name: str, blocks: list) -> None:
    """Replace the binding blocks of function ``name`` (in ``bb``'s module), normalized."""
    func = mod[name]
    new_func = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                              func.is_pure, func.attrs)
    bb.update_func(mod.get_global_var(name), bb.normalize(new_func))


def drop_unused_emits(mod: tvm.IRModule) -> tvm.IRModule:
    """Remove private functions no longer called (the members' old Emit functions)."""
    used: set[str] = set()
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function) and func.attrs is not None and "global_symbol" in func.attrs:
            for g in relax.analysis.all_global_vars(func):
                used.add(g.name_hint)
    keep = tvm.IRModule({}, attrs=mod.attrs) if mod.attrs is not None else tvm.IRModule({})
    for gv, func in mod.functions_items():
        is_emit = isinstance(func, relax.Function) and func.attrs is not None and EMIT_ATTR in func.attrs
        if is_emit and gv.name_hint not in used:
            continue
        keep[gv] = func
    return keep
