"""Row predicates of unrolled loops taken out of a tile's row sums where the whole tile is
in range.

A schedule that tiles a symbolic row count pads the last tile, and each block below the
tile keeps a predicate ``row < rows``.  Where the rows are an unrolled loop inside a loop
over keys (the attention's row sums: 8 rows' serial sums interleaved, ``attention.
_schedule_row_block``), that is a compare and a branch per row and key.
``unswitch_unrolled_rows`` rewrites each loop nest directly under a parallel loop of
``func`` that holds a float sum (a block ``acc = acc + x`` with an init)::

    if <every instance of the predicate, for each value of the unrolled loop>:
        <the nest without those predicates>
    else:
        <the nest as it was>

A predicate conjunct is taken out only when the one loop of the nest it reads is an
unrolled loop of constant extent; the condition is the conjunction of its instances at
every value of that loop, so the copy runs exactly where each dropped conjunct holds (no
analysis of the predicate's form is needed for that).  The copy defines its own loop and
block variables.  Results are unchanged: each block instance runs in the copy exactly when
it ran in the original.

The row sums only: they carry one predicate per row and key; on the 16-head attention of
the 110M LLaMA (masked keys skipped) the kernel took 16.5-16.9 -> 15.2-16.2 ms at 1024 x 1024
keys, 12.4-12.9 -> 11.0-11.4 ms for 512 rows after 512 cached, 16.2-16.5 -> 14.5-14.8 ms at
1000 x 1000; unswitching the row max's nest too gained nothing more measurable.
"""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx

from .common import conjunction, conjuncts, nodes_in, uses_var

# unrolled loops longer than this are left alone (their condition would be that long)
MAX_UNROLLED = 16


def _fresh(stmt: tirx.Stmt) -> tirx.Stmt | None:
    """``stmt`` with a variable of its own for each loop and block iter it defines (a copy
    beside the original); None when a block in it allocates a buffer."""
    blocks = nodes_in(stmt, s_tir.SBlock)
    if any(len(b.alloc_buffers) for b in blocks):
        return None
    defined = [f.loop_var for f in nodes_in(stmt, tirx.For)] + [iv.var for b in blocks for iv in b.iter_vars]
    fresh = [(v, tirx.Var(v.name, str(v.ty.dtype))) for v in defined]
    return tvm_ffi.structural_map(stmt, [(tirx.Var, lambda v: next((n for o, n in fresh if o.same_as(v)), v))])


def _instances(conjunct: tirx.Expr, loop: tirx.For) -> list[tirx.Expr]:
    var = loop.loop_var
    return [tvm_ffi.structural_map(conjunct, [(tirx.Var, lambda v, i=i: tirx.const(i, str(var.ty.dtype))
                                                if v.same_as(var) else v)])
            for i in range(int(loop.extent.value))]


def _sums(nest: tirx.Stmt) -> bool:
    """Whether a block of ``nest`` accumulates a float sum (``acc = acc + x``, an init)."""
    return any(b.init is not None and isinstance(b.body, tirx.BufferStore) and isinstance(b.body.value, tirx.Add)
               and str(b.body.buffer.ty.dtype).startswith("float") for b in nodes_in(nest, s_tir.SBlock))


def _unswitched(nest: tirx.Stmt) -> tirx.Stmt:
    """``nest`` under a guard of its unrolled loops' predicates (module docstring), or as it is."""
    if not _sums(nest):
        return nest
    loops = nodes_in(nest, tirx.For)
    unrolled = [f for f in loops if f.kind == tirx.ForKind.UNROLLED and isinstance(f.extent, tirx.IntImm)
                and isinstance(f.min, tirx.IntImm) and f.min.value == 0 and f.extent.value <= MAX_UNROLLED]
    if not unrolled:
        return nest
    guard: list[tirx.Expr] = []
    kept: dict = {}
    realizes = nodes_in(nest, s_tir.SBlockRealize)
    for block_realize in realizes:
        keep = []
        for conjunct in conjuncts(block_realize.predicate):
            used = [f for f in loops if uses_var(conjunct, f.loop_var)]
            if len(used) == 1 and any(used[0].same_as(f) for f in unrolled):
                guard += _instances(conjunct, used[0])
            else:
                keep.append(conjunct)
        kept[block_realize.block.name_hint] = keep
    if not guard or len(kept) != len(realizes):  # two realizes of one block name: leave it
        return nest

    def strip(realize: s_tir.SBlockRealize) -> s_tir.SBlockRealize:
        return s_tir.SBlockRealize(realize.iter_values, conjunction(kept[realize.block.name_hint]), realize.block)

    copy = _fresh(tvm_ffi.structural_map(nest, [(s_tir.SBlockRealize, strip)]))
    return nest if copy is None else tirx.IfThenElse(conjunction(guard), copy, nest)


def unswitch_unrolled_rows(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each loop nest directly under a root-level parallel loop unswitched
    (module docstring)."""
    root = func.body
    if not isinstance(root, s_tir.SBlockRealize):
        return func
    top = list(root.block.body.seq) if isinstance(root.block.body, tirx.SeqStmt) else [root.block.body]
    changed = False
    for i, stmt in enumerate(top):
        if not isinstance(stmt, tirx.For) or stmt.kind != tirx.ForKind.PARALLEL:
            continue
        kids = list(stmt.body.seq) if isinstance(stmt.body, tirx.SeqStmt) else [stmt.body]
        new = [_unswitched(kid) for kid in kids]
        if any(not a.same_as(b) for a, b in zip(new, kids)):
            body = tirx.SeqStmt(new) if len(new) > 1 else new[0]
            top[i] = tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding,
                              stmt.annotations)
            changed = True
    if not changed:
        return func
    block = root.block
    body = tirx.SeqStmt(top) if len(top) > 1 else top[0]
    new_root = s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body, block.init,
                            block.alloc_buffers, block.match_buffers, block.annotations)
    return func.with_body(s_tir.SBlockRealize(root.iter_values, root.predicate, new_root))


__all__ = ["unswitch_unrolled_rows"]
