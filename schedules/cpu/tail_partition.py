"""PartitionVectorTails: a symbolic loop split into whole vectors and its tail, by us.

``split_vector_tail`` marks a loop of symbolic extent with ``PARTITION_HINT`` so that
the vectors whose lanes are all in bounds run without their predicate.  TVM's
``LoopPartition`` does that split, but it clamps the split point against the loop's end
and not its start: where the point it deduces can be negative, the loop after it starts
at a negative index and the kernel writes before its buffer (heap corruption).  With the
hint it also splits on every comparison under the loop, not only the tail predicate:
``tril``'s ``j + 2 <= i`` gave ``(i - 17) // 16 + 1``, negative in the first rows; and a
tail predicate ``16 o + i < max(n - 3, 0)`` (a descending ``arange``) gave
``(n - 19) // 16 + 1``, negative for ``n < 3``.

Here each hinted loop ``for o in [0, X)`` of symbolic extent is split by us, before the
lowering, into ``for o in [0, m)`` without the tail predicates and ``for o in [m, X)``
with them, and the hint is dropped.  A tail predicate is a conjunct ``L o + r < b`` of a
block predicate (``L`` a positive constant, ``r`` bounded above by ``r_max`` over the
loops inside, ``b`` invariant in them); it holds for every ``o < (b - r_max - 1) // L +
1``. ``m`` is the least of those bounds, clamped to ``[0, X]``.

Sound: the two loops run ``[0, m)`` and ``[m, X)`` of the original iterations, in order;
a predicate is dropped only from iterations where it is proven true (``o L + r <= o L +
r_max <= b - 1``); the copy gets fresh definitions (``ConvertSSA``). A loop whose
predicates on ``o`` are not all of that form loses the hint and keeps its predicate on
every iteration. Loops of constant extent keep the hint (``LoopPartition`` needs it to
act there, and its bounds are constants). Runs on S-TIR with opaque blocks
(``parallel_guard._pipeline``), before the lowering.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, sym, tirx
from tvm.target import Target

from .common import PARTITION_HINT, conjunction, conjuncts, static_extent, uses_var
from .llvm_pass import llvm_prim_func_pass


def _as_less_than(cond: tirx.Expr) -> tuple[tirx.Expr, tirx.Expr] | None:
    """``(a, b)`` with ``cond`` equivalent to ``a < b`` (integers), else None."""
    if isinstance(cond, tirx.LT):
        return cond.a, cond.b
    if isinstance(cond, tirx.LE):
        return cond.a, cond.b + tirx.const(1, cond.b.ty)
    if isinstance(cond, tirx.GT):
        return cond.b, cond.a
    if isinstance(cond, tirx.GE):
        return cond.b, cond.a + tirx.const(1, cond.a.ty)
    return None


def _inner_ranges(body: tirx.Stmt) -> sym.Analyzer | None:
    """An analyzer bound to the ranges of the loops under ``body``; None when one of
    them has symbolic bounds."""
    analyzer, ok = sym.Analyzer(), [True]

    def visit(loop: tirx.For) -> None:
        if static_extent(loop.extent) is None or not isinstance(loop.min, tirx.IntImm):
            ok[0] = False
            return
        analyzer.bind(loop.loop_var, tvm.ir.Range.from_min_extent(loop.min, loop.extent))

    tvm_ffi.structural_walk(body, [(tirx.For, visit)])
    return analyzer if ok[0] else None


def _true_below(cond: tirx.Expr, var: tirx.Var, analyzer: sym.Analyzer,
                outside: list[tirx.Var]) -> tirx.Expr | None:
    """``m`` with ``cond`` true for every ``var < m`` and every inner iteration, or None
    when ``cond`` is not a tail predicate ``L var + r < b`` with ``b`` reading only
    ``outside`` variables (module docstring)."""
    pair = _as_less_than(cond)
    if pair is None:
        return None
    a, b = pair
    linear = sym.detect_linear_equation(a, [var])
    if len(linear) != 2 or not isinstance(linear[0], tirx.IntImm) or linear[0].value <= 0:
        return None
    step, rest = linear[0], linear[1]
    invariant = all(any(v.same_as(o) for o in outside) for v in tirx.analysis.undefined_vars(b))
    if uses_var(rest, var) or not invariant:
        return None
    bound = analyzer.const_int_bound(rest)
    if bound.max_value >= sym.ConstIntBound.POS_INF:
        return None
    r_max = tirx.const(bound.max_value, b.ty)
    return tirx.floordiv(b - r_max - tirx.const(1, b.ty), step) + tirx.const(1, b.ty)


def _tail_bound(loop: tirx.For) -> tuple[tirx.Expr, list[tirx.Expr]] | None:
    """The main part's end (unclamped) and the predicate conjuncts it makes true; None
    when a conjunct on the loop variable is not a tail predicate or there is none."""
    analyzer = _inner_ranges(loop.body)
    if analyzer is None:
        return None
    conds: list[tirx.Expr] = []
    tvm_ffi.structural_walk(loop.body, [(s_tir.SBlockRealize, lambda r: conds.extend(
        c for c in conjuncts(r.predicate) if uses_var(c, loop.loop_var)))])
    outside = tirx.analysis.undefined_vars(loop)  # what the loop reads from before it
    bounds = [_true_below(c, loop.loop_var, analyzer, outside) for c in conds]
    if not bounds or any(b is None for b in bounds):
        return None
    end = bounds[0]
    for b in bounds[1:]:
        end = tirx.min(end, b)
    return end, conds


def _without(body: tirx.Stmt, conds: list[tirx.Expr]) -> tirx.Stmt:
    """``body`` with the given predicate conjuncts (the same objects) made true."""
    def drop(realize: s_tir.SBlockRealize) -> s_tir.SBlockRealize:
        kept = [c for c in conjuncts(realize.predicate) if not any(c.same_as(d) for d in conds)]
        return s_tir.SBlockRealize(realize.iter_values, conjunction(kept), realize.block, realize.span)

    return tvm_ffi.structural_map(body, [(s_tir.SBlockRealize, drop)])


def _partitioned(loop: tirx.For) -> tirx.Stmt:
    if PARTITION_HINT not in loop.annotations or static_extent(loop.extent) is not None:
        return loop
    annotations = {k: v for k, v in loop.annotations.items() if k != PARTITION_HINT}
    found = _tail_bound(loop) if isinstance(loop.min, tirx.IntImm) and loop.min.value == 0 else None
    if found is None:
        return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, loop.body,
                        loop.thread_binding, annotations, loop.step, loop.span)
    end, conds = found
    ty = loop.extent.ty
    clamped = tirx.max(tirx.min(tirx.Cast(str(ty), end), loop.extent), tirx.const(0, ty))
    split = sym.Analyzer().simplify(clamped)
    main = tirx.For(loop.loop_var, loop.min, split, loop.kind, _without(loop.body, conds),
                    loop.thread_binding, annotations)
    shifted = tvm_ffi.structural_map(
        loop.body, [(tirx.Var, lambda v: v + split if v.same_as(loop.loop_var) else v)])
    tail = tirx.For(loop.loop_var, loop.min, loop.extent - split, loop.kind, shifted,
                    loop.thread_binding, annotations)
    return tirx.SeqStmt([main, tail])


def partition_vector_tails(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each hinted loop of symbolic extent split into its whole vectors and
    its tail (module docstring)."""
    split = tvm_ffi.structural_map(func, [(tirx.For, _partitioned)])
    if split.same_as(func):
        return func
    # the two parts define the same loop and buffer variables: fresh ones for the second
    return tirx.transform.ConvertSSA()(tvm.IRModule({"main": split}))["main"]


def PartitionVectorTails(target: Target | None = None) -> tvm.transform.Pass:
    """PrimFunc pass applying ``partition_vector_tails`` to the PrimFuncs compiled for LLVM."""
    return llvm_prim_func_pass(partition_vector_tails, target, "PartitionVectorTails")


__all__ = ["PartitionVectorTails", "partition_vector_tails"]
