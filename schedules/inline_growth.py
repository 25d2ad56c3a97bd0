"""How much an inline grows the expression it substitutes into: ``inlines_too_much``.

``compute_inline`` of a block replaces every load of its buffer in its consumers by the
block's whole expression. A consumer that reads it k times gets k copies; a chain in which
each block reads the one before twice (``r1 = x + x``, ``r2 = r1 + r1``, ...) doubles at
every step: 16 such adds in one fused elementwise kernel made an expression of 2^16 nodes,
2.5 s of scheduling and 12 s of LLVM, and 20 of them minutes. A rule leaves such a block
materialized (its own loop, a buffer) once the consumer's expression would exceed
``MAX_INLINED_NODES`` nodes, far above any fused chain a model makes otherwise.

Only a size estimate of the trees, counted as trees (a copy counts each time it appears):
the inline is refused or done as before, so results do not change either way.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx

MAX_INLINED_NODES = 512


def _size_and_loads(expr: tirx.Expr, buffer: tirx.Buffer | None) -> tuple[int, int]:
    """Nodes of ``expr`` as a tree, and its loads of ``buffer``."""
    counts = [0, 0]

    def node(e: tvm.ir.Expr) -> None:
        counts[0] += 1
        if buffer is not None and isinstance(e, tvm.ir.TensorLoad) and e.source.same_as(buffer):
            counts[1] += 1

    tvm_ffi.structural_walk(expr, [(tvm.ir.Expr, node)])
    return counts[0], counts[1]


def _stored(block: s_tir.SBlock) -> tirx.BufferStore | None:
    return block.body if isinstance(block.body, tirx.BufferStore) else None


def _grown(producer: s_tir.SBlock, consumer: s_tir.SBlock) -> int:
    """The size of ``consumer``'s stored expression once ``producer`` is inlined into it."""
    made, used = _stored(producer), _stored(consumer)
    if made is None or used is None:
        return 0
    size, _ = _size_and_loads(made.value, None)
    own, loads = _size_and_loads(used.value, made.buffer)
    return own + loads * max(size - 1, 0)


def inlines_too_much(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, reverse: bool) -> bool:
    """Whether ``compute_inline(block)`` (``reverse``: ``reverse_compute_inline``) would
    leave an expression above ``MAX_INLINED_NODES`` nodes (module docstring)."""
    if reverse:
        consumer = sch.get(block)
        return any(_grown(sch.get(p), consumer) > MAX_INLINED_NODES for p in sch.get_producers(block))
    producer = sch.get(block)
    return any(_grown(producer, sch.get(c)) > MAX_INLINED_NODES for c in sch.get_consumers(block))


__all__ = ["MAX_INLINED_NODES", "inlines_too_much"]
