"""Shared driver of our op-level Relax passes that rewrite one dataflow block at a time."""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern, rewrite_call

# (block builder, block, uses of each var in the function) -> (block, whether it changed)
BlockRewrite = Callable[[relax.BlockBuilder, relax.DataflowBlock, dict], tuple[relax.DataflowBlock, bool]]


def use_counts(func: relax.Function) -> dict:
    """How many times each variable is read in ``func``'s body."""
    counts: dict = {}

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Var):
            counts[expr] = counts.get(expr, 0) + 1

    relax.analysis.post_order_visit(func.body, visit)
    return counts


def rewrite_dataflow_blocks(mod: tvm.IRModule, rewrite: BlockRewrite, *,
                            to_fixpoint: bool = False) -> tvm.IRModule:
    """``mod`` with ``rewrite`` applied to every dataflow block of every Relax function
    (again, with fresh use counts, until nothing changes when ``to_fixpoint``), normalized
    so the rebuilt bodies get their types; the caller's module stays as it was."""
    bb = relax.BlockBuilder(mod)
    updates = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        changed_any = False
        for _ in range(sum(len(b.bindings) for b in func.body.blocks) + 1 if to_fixpoint else 1):
            counts = use_counts(func)
            blocks, changed = [], False
            for block in func.body.blocks:
                if isinstance(block, relax.DataflowBlock):
                    block, moved = rewrite(bb, block, counts)
                    changed |= moved
                blocks.append(block)
            if not changed:
                break
            changed_any = True
            body = relax.SeqExpr(blocks, func.body.body)
            func = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)
        if changed_any:
            updates[gv] = func
    if not updates:
        return mod
    known = {gv.name_hint for gv in mod.get_global_vars()}
    added = [(gv, f) for gv, f in bb.get().functions_items() if gv.name_hint not in known]
    mod = mod.clone()
    for gv, func in [*added, *updates.items()]:  # the functions a rewrite added with bb.add_func too
        mod[gv] = func
    return relax.transform.Normalize()(mod)


def operand_key(value: relax.Expr, reshapes: dict) -> relax.Expr | tuple[relax.Expr, tuple]:
    """What identifies an operand across bindings: itself, or (source, shape) when it is a
    ``reshape`` binding of ``reshapes`` (var -> binding; frontends flatten an input once per
    layer), a symbolic dim by its expression (within one function a name is one variable)."""
    shape = getattr(value.ty, "shape", None)
    if value in reshapes and isinstance(shape, relax.ShapeExpr):
        source, _shape = reshapes[value].value.args
        return (source, tuple(int(d.value) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in shape.values))
    return value


def splice_block(block: relax.DataflowBlock, replace: dict, before: dict | None = None) -> relax.DataflowBlock:
    """``block`` with each binding whose var is a key of ``replace`` replaced by that list
    of bindings (empty: dropped), and the bindings of ``before`` (var -> list) put in front
    of the binding of that var."""
    before = before or {}
    out = []
    for b in block.bindings:
        out.extend(before.get(b.var, []))
        out.extend(replace.get(b.var, [b]))
    return relax.DataflowBlock(out)


def rewrite_and_drop_dead(mod: tvm.IRModule, rewrite: BlockRewrite, *, to_fixpoint: bool = False) -> tvm.IRModule:
    """``rewrite_dataflow_blocks``, then TVM's DeadCodeElimination when anything changed
    (the bindings the rewrite left unread); ``mod`` itself when nothing did."""
    out = rewrite_dataflow_blocks(mod, rewrite, to_fixpoint=to_fixpoint)
    return mod if out.same_as(mod) else relax.transform.DeadCodeElimination()(out)


def rewrite_op_calls(func: relax.Function, pattern: DFPattern, rewrite: Callable[[relax.Expr, dict], relax.Expr]
                     ) -> relax.Function:
    """``relax.dpl.rewrite_call(pattern, rewrite, func)`` on a Relax function, leaving a
    Primitive (already lifted) function alone: the body of an op-level pass."""
    if func.attrs is not None and "Primitive" in func.attrs and int(func.attrs["Primitive"]):
        return func
    return rewrite_call(pattern, rewrite, func)
