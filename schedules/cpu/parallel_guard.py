"""Parallel loops of symbolic extent that run serially when a call's work is small.

A schedule decides on a constant extent whether a loop is worth the thread pool: below
``MIN_PARALLEL_WORK`` statement instances the launch (waking the pool, joining it) costs
more than it saves, and the rules leave the loop serial.  A symbolic extent has no such
answer at compile time, so the rules parallelize, and a dynamic-shape kernel then pays a
pool launch on every call, also at a sequence of 16 where its static twin runs serially in
a fraction of a launch's time.

``GuardSmallParallel`` makes the choice per call: each parallel loop whose work (the
statement instances of its nest, ``symbolic_work``: a vector store counts its lanes, as
``common.nest_work`` counts a constant nest before vectorization) is symbolic becomes::

    if work >= MIN_PARALLEL_WORK: <the parallel loop>
    else: <the same loop, serial>

It runs on lowered TIR (after the S-TIR pipeline, ``tir_pipeline``), where buffer
allocation has been placed: a copy made earlier would have moved the per-iteration
buffers of both copies to their common ancestor, outside the loop.  The serial copy gets
fresh definitions (``s_tir.renew_defs``), so no variable is defined twice.

Why it is sound: a legal parallel loop has independent iterations, and running them in
order is one of the executions the parallel loop allows; the guard reads only variables
defined outside the loop.  Loops whose work reads a variable bound inside the loop, or
that hold a ``While``, are left alone, as are loops of constant work (their schedules
decided already).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir import Expr
from tvm.target import Target

from .amx_int8 import AMXPermission
from .common import MIN_PARALLEL_WORK
from .gemm_prefetch import PrefetchNextPanel
from .index_forms import FoldNestedMods, after_opaque_blocks, opaque_blocks
from .llvm_pass import llvm_prim_func_pass
from .stack_tiles import StackLocalTiles
from .tail_partition import PartitionVectorTails
from .zero_fill import FlatZeroFill

# Marks the parallel loop of a guard (so a second run leaves it).
GUARDED = "aicf.work_guarded"


def symbolic_work(stmt: tirx.Stmt) -> Expr | None:
    """Statement instances the nest executes, as an int64 expression (both branches of an
    ``if`` counted: an upper bound); None when it holds a loop of unknown trip count."""
    if isinstance(stmt, tirx.For):
        inner = symbolic_work(stmt.body)
        return None if inner is None else tirx.Cast("int64", stmt.extent) * inner
    if isinstance(stmt, tirx.SeqStmt):
        total = tirx.const(0, "int64")
        for part in stmt.seq:
            work = symbolic_work(part)
            if work is None:
                return None
            total = total + work
        return total
    if isinstance(stmt, tirx.IfThenElse):
        parts = [symbolic_work(s) for s in (stmt.then_case, stmt.else_case) if s is not None]
        if any(part is None for part in parts):
            return None
        return sum(parts[1:], parts[0])
    if isinstance(stmt, tirx.AttrStmt):
        return symbolic_work(stmt.body)
    if isinstance(stmt, tirx.While):
        return None
    if isinstance(stmt, tirx.BufferStore):
        return tirx.const(max(int(stmt.value.ty.dtype.lanes), 1), "int64")
    if isinstance(stmt, (tirx.LetStmt, tirx.AllocBuffer, tirx.DeclBuffer)):
        return tirx.const(0, "int64")
    return tirx.const(1, "int64")


def _defined_inside(loop: tirx.For) -> list[tirx.Var]:
    """The variables a statement under ``loop`` (or the loop itself) binds."""
    found = [loop.loop_var]

    def on_for(node: tirx.For) -> None:
        found.append(node.loop_var)

    def on_let(node: tirx.LetStmt) -> None:
        found.append(node.var)

    def on_alloc(node: tirx.AllocBuffer) -> None:
        found.append(node.buffer.data)

    tvm_ffi.structural_walk(loop.body, [(tirx.For, on_for), (tirx.LetStmt, on_let), (tirx.AllocBuffer, on_alloc)])
    return found


def _has_parallel(stmt: tirx.Stmt) -> bool:
    found = []

    def on_for(node: tirx.For) -> None:
        found.append(node.kind == tirx.ForKind.PARALLEL)

    tvm_ffi.structural_walk(stmt, [(tirx.For, on_for)])
    return any(found)


def guard_condition(loop: tirx.For) -> Expr | None:
    """``work >= MIN_PARALLEL_WORK`` for a parallel ``loop`` of symbolic work; None where
    the loop is to stay as it is (module docstring)."""
    if loop.kind != tirx.ForKind.PARALLEL or GUARDED in loop.annotations or _has_parallel(loop.body):
        return None
    work = symbolic_work(loop)
    if work is None:
        return None
    work = tvm.sym.Analyzer().simplify(work)
    if isinstance(work, tirx.IntImm):
        return None
    inside = _defined_inside(loop)
    if any(v.same_as(d) for v in tirx.analysis.undefined_vars(work) for d in inside):
        return None
    return work >= tirx.const(MIN_PARALLEL_WORK, "int64")


def _serial_copy(loop: tirx.For) -> tirx.Stmt:
    """``loop`` as a serial loop with fresh variable and buffer definitions, its body's
    buffers of loop-invariant shape allocated once before it (``_hoist_allocations``)."""
    serial = tirx.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.SERIAL, loop.body,
                      annotations=loop.annotations)
    return _hoist_allocations(s_tir.renew_defs(tirx.PrimFunc([], serial)).body)


def _hoist_allocations(loop: tirx.For) -> tirx.Stmt:
    """The buffers ``loop``'s body allocates first thing, of a shape defined outside the
    loop, allocated before the loop instead: one allocation per call, not one heap
    workspace per iteration (a symbolic size is never a stack allocation).  Serial
    iterations reuse the buffer; a buffer's contents are never read before the iteration
    that allocated it writes them (TIR allocates uninitialized memory)."""
    body = loop.body
    if not isinstance(body, tirx.SeqStmt):
        return loop
    inside = _defined_inside(loop)
    hoisted, rest = [], []
    for stmt in body.seq:
        if not rest and isinstance(stmt, tirx.AllocBuffer) and not any(
            v.same_as(d) for extent in stmt.buffer.shape for v in tirx.analysis.undefined_vars(extent) for d in inside
        ):
            hoisted.append(stmt)
        else:
            rest.append(stmt)
    if not hoisted:
        return loop
    inner = rest[0] if len(rest) == 1 else tirx.SeqStmt(rest)
    moved = tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, inner, annotations=loop.annotations)
    return tirx.SeqStmt([*hoisted, moved])


def _guard(loop: tirx.For) -> tirx.Stmt:
    condition = guard_condition(loop)
    if condition is None:
        return loop
    annotations = {**loop.annotations, GUARDED: True}
    parallel = tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, loop.body, annotations=annotations)
    return tirx.IfThenElse(condition, parallel, _serial_copy(loop))


def guard_small_parallel(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each parallel loop of symbolic work guarded (module docstring)."""
    return tvm_ffi.structural_map(func, [(tirx.For, _guard)])


def GuardSmallParallel(target: Target | None = None) -> tvm.transform.Pass:
    """PrimFunc pass applying ``guard_small_parallel`` to the PrimFuncs compiled for an LLVM
    target (the PrimFunc's ``target`` attr, else ``target``, else ``with target:``)."""
    return llvm_prim_func_pass(guard_small_parallel, target, "GuardSmallParallel")


PIPELINE = "aicf_cpu"


def _pipeline() -> tuple:
    """The S-TIR pipeline, with one form for nested head indices before its buffer
    compaction (``index_forms``) and vector tails split off by us (``tail_partition``),
    then ``GuardSmallParallel``, a fresh buffer's zeroing as one flat loop (``zero_fill``),
    and the OS's permission asked first by each kernel that uses
    AMX tiles (``amx_int8.AMXPermission``); its finalization passes."""
    lower, host, device = tirx.get_tir_pipeline("s_tir")
    passes = [*opaque_blocks(), FoldNestedMods(), PartitionVectorTails(), after_opaque_blocks(lower),
              GuardSmallParallel(), PrefetchNextPanel(), StackLocalTiles(), FlatZeroFill(), AMXPermission()]
    return tvm.transform.Sequential(passes), host, device


def tir_pipeline() -> str:
    """The name of the TIR pipeline to build CPU kernels with (``tvm.compile(...,
    tir_pipeline=...)``; TVM takes a registered name there, not a pass)."""
    tirx.register_tir_pipeline(PIPELINE, _pipeline)
    return PIPELINE
