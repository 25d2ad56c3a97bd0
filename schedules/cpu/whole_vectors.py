"""A float max over keys that are not a whole number of vectors, rewritten to run over
whole vectors.

A max is idempotent: a term that is already in the set changes nothing (a NaN there was
already a term; so was either zero).  So the reduction can run over more terms, as long
as each extra one repeats a real one:

* a symbolic extent ``n``: ``max(x[min(k // lanes * lanes, n - lanes) + k % lanes] for k <
  ceil(n / lanes) * lanes)`` when ``n >= lanes`` (the last vector ends at ``n``, as for a
  constant below), else ``max(x[min(k, n - 1)] ...)``, the extra terms repeating ``x[n - 1]``;
  the choice is one branch per term on a value the whole loop shares (``if_then_else``
  evaluates only the branch it takes);
* a constant ``n`` above ``lanes`` but not a multiple: the last vector is read where it
  ends at ``n`` instead of where it starts, ``x[min(k // lanes * lanes, n - lanes) + k %
  lanes]`` over ``ceil(n / lanes) * lanes`` terms; it repeats the ``lanes - n % lanes``
  terms before it, and every vector is still one contiguous load (a clamped index would
  make the last one a gather).

The padded extent is a multiple of ``lanes``, so the attention rule can ``rfactor`` the max
into a max per lane without the tail predicate that ``compute_at`` would drop in TVM 0.27
(a vector max over the keys instead of a scalar one; ``schedules/cpu/attention.py``).
A sum is not idempotent and is never rewritten; neither is an integer max (SDPA's
all-masked-row guard, an int8 max of ``score != -inf``: split over int8 lanes it made
attention at 192 to 257 keys slower) nor a max whose
reduction loop binds anything but its own iter.
"""

from __future__ import annotations

import tvm_ffi
from tvm import ir, s_tir, tirx
from tvm.ir import Range

from .common import static_extent, uses_var


def is_float_max(block: s_tir.SBlock) -> bool:
    """Whether ``block`` is a max reduction into a float buffer."""
    store = block.body
    return (block.init is not None and isinstance(store, tirx.BufferStore)
            and isinstance(store.value, tirx.Max) and store.buffer.dtype.startswith("float"))


def is_float_sum(block: s_tir.SBlock) -> bool:
    """Whether ``block`` is a sum reduction (``acc = acc + x``) into a float buffer."""
    store = block.body
    return (block.init is not None and isinstance(store, tirx.BufferStore)
            and isinstance(store.value, tirx.Add) and store.buffer.dtype.startswith("float")
            and isinstance(store.value.a, ir.TensorLoad) and store.value.a.source.same_as(store.buffer))


def _substitute(node, var: tirx.Var, value: tirx.Expr):
    return tvm_ffi.structural_map(node, [(tirx.Var, lambda v: value if v.same_as(var) else v)])


def _padded(loop: tirx.For, lanes: int) -> tirx.For:
    """``loop`` padded when it is the reduction loop, from 0, of a float max block (and binds
    nothing else) over a symbolic extent or a constant one above ``lanes`` that is not a
    multiple of it, else as it is."""
    realize = loop.body
    if not isinstance(realize, s_tir.SBlockRealize) or not is_float_max(realize.block):
        return loop
    block = realize.block
    *_, reduce_iv = block.iter_vars
    extent = reduce_iv.dom.extent
    constant = static_extent(extent)
    if constant is not None and (constant <= lanes or constant % lanes == 0):
        return loop
    if (reduce_iv.iter_type != tirx.IterVar.CommReduce
            or not realize.iter_values[-1].same_as(loop.loop_var) or static_extent(loop.min) != 0
            or static_extent(reduce_iv.dom.min) != 0 or not tvm_ffi.structural_equal(loop.extent, extent)
            or static_extent(realize.predicate) != 1
            or any(uses_var(value, loop.loop_var) for value in realize.iter_values[:-1])
            or any(uses_var(index, reduce_iv.var) for index in block.body.indices)):
        return loop
    var = reduce_iv.var
    store = block.body
    if constant is None:
        padded = tirx.floordiv(extent + (lanes - 1), lanes) * lanes
        clamped = tirx.min(var, extent - 1)
        # at least a vector of keys: the last vector ends at the extent (every vector one
        # contiguous load; a clamped index is a gather); fewer: the clamped index
        lane = tirx.const(lanes, str(var.ty))
        overlap = (tirx.max(tirx.min(tirx.floordiv(var, lanes) * lanes, extent - lane), tirx.const(0, str(var.ty)))
                   + tirx.floormod(var, lanes))
        def chosen(term: tirx.Expr) -> tirx.Expr:  # the term of key var, read by one index or the other
            if not uses_var(term, var):
                return term  # the accumulator
            return tirx.if_then_else(lane <= extent, _substitute(term, var, overlap), _substitute(term, var, clamped))

        value = tirx.Max(chosen(store.value.a), chosen(store.value.b))  # the operands in their order
    else:  # the last vector ends at the extent: it overlaps the one before
        padded = tirx.const(-(-constant // lanes) * lanes, str(extent.ty))
        clamped = (tirx.min(tirx.floordiv(var, lanes) * lanes, tirx.const(constant - lanes, str(var.ty)))
                   + tirx.floormod(var, lanes))
        value = _substitute(store.value, var, clamped)
    body = tirx.BufferStore(store.buffer, value, store.indices)
    reads = [_substitute(region, var, clamped) for region in block.reads]
    domain = Range.from_min_extent(tirx.const(0, str(padded.ty)), padded)
    iv = tirx.IterVar(domain, var, reduce_iv.iter_type)
    new_block = s_tir.SBlock([*block.iter_vars[:-1], iv], reads, block.writes, block.name_hint, body,
                             block.init, block.alloc_buffers, block.match_buffers, block.annotations)
    new_realize = s_tir.SBlockRealize(realize.iter_values, realize.predicate, new_block)
    return tirx.For(loop.loop_var, loop.min, padded, loop.kind, new_realize, loop.thread_binding,
                    loop.annotations)


def pad_max(func: tirx.PrimFunc, lanes: int) -> tirx.PrimFunc:
    """``func`` with every float max over a symbolic extent, or over a constant one that is
    not a whole number of ``lanes`` vectors, padded to whole vectors (module docstring)."""
    return tvm_ffi.structural_map(func, [(tirx.For, lambda loop: _padded(loop, lanes))])
