"""Block-graph helpers shared by the CPU GEMM and conv2d rules.

Finding the one reduction block, inlining the injective blocks around it, and the plain
parallel + vectorised schedule for copy/elementwise blocks left standing (pads, im2col
pads, epilogues that cannot be fused). Inlining goes through ``compute_inline``, which
checks its own preconditions; a refusal just leaves the block as a separate pass, and so
does a block that stores an immediate (``schedules.constants``).
"""

from __future__ import annotations

from tvm import ir, s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.schedule import LoopRV, SBlockRV

from ..constants import inlines_a_constant
from ..inline_growth import inlines_too_much
from .common import loop_extent

# TVM's names (relax.transform.SplitLayoutRewritePreproc reads the annotation); this
# package imports only TVM, so they are spelled here as in aicf_tvm.core.emit
LAYOUT_FREE_ATTR = "layout_free_buffers"
PREPACK_ANNOTATION = "meta_schedule.layout_rewrite_preproc"


def find_reduction_block(sch: s_tir.Schedule) -> SBlockRV | None:
    """The single reduction block under the root, when all others are spatial."""
    found = None
    for block in sch.get_child_blocks(get_root_block(sch)):
        kinds = {iv.iter_type for iv in sch.get(block).iter_vars}
        if not kinds <= {tirx.IterVar.DataPar, tirx.IterVar.CommReduce}:
            return None
        if tirx.IterVar.CommReduce in kinds:
            if found is not None:
                return None
            found = block
    return found


def static_reduction_block(sch: s_tir.Schedule) -> tuple[SBlockRV, str] | None:
    """The single reduction block (``find_reduction_block``) and its iterators' kinds
    (``"SSRR"``: spatial, reduction), when every extent is a constant; else None."""
    main = find_reduction_block(sch)
    if main is None:
        return None
    stmt = sch.get(main)
    if not all(isinstance(iv.dom.extent, tirx.IntImm) for iv in stmt.iter_vars):
        return None
    return main, "".join("S" if iv.iter_type == tirx.IterVar.DataPar else "R" for iv in stmt.iter_vars)


def _transitive(sch: s_tir.Schedule, block: SBlockRV, step) -> list[SBlockRV]:
    out: list[SBlockRV] = []
    for nxt in step(block):
        out.append(nxt)
        out.extend(_transitive(sch, nxt, step))
    return out


def _inline_first(sch: s_tir.Schedule, blocks: list[SBlockRV], skip_outputs: bool) -> bool:
    for block in blocks:
        if skip_outputs and not sch.get_consumers(block):
            continue  # an output block: the chain ends here
        if inlines_a_constant(sch, block, reverse=False) or inlines_too_much(sch, block, reverse=False):
            continue  # TVM would fold the immediate (schedules.constants), or copies of copies
        try:
            sch.compute_inline(block)
            return True
        except s_tir.ScheduleError:
            continue
    return False


def inline_producers(sch: s_tir.Schedule, block: SBlockRV) -> None:
    """Inline every block feeding ``block`` (transitively) that TensorIR lets us inline."""
    # Restart after each inline: in a diamond the same block is listed twice, and an
    # inlined block's handle is dead.
    while _inline_first(sch, _transitive(sch, block, sch.get_producers), skip_outputs=False):
        pass


def inline_consumers(sch: s_tir.Schedule, block: SBlockRV) -> list[SBlockRV]:
    """Inline the consumer chain of ``block`` into its output blocks; return its consumers."""
    while _inline_first(sch, _transitive(sch, block, sch.get_consumers), skip_outputs=True):
        pass
    return sch.get_consumers(block)


def iterate_as_read(sch: s_tir.Schedule, block: SBlockRV, buffer: tirx.Buffer) -> bool:
    """Re-index ``block``'s iteration space by the indices it reads ``buffer`` at, so it reads
    ``buffer`` at plain iters; whether it did.

    An epilogue behind a view reads the GEMM's rows at a fused index: ``C[b * s + t, n]``
    over iters ``(b, t, n)``. Iterating it over ``(m, n) = (b * s + t, n)`` instead (its other
    accesses become ``x[m // s, m % s, n]``) makes that read plain, so it can run inside the
    GEMM's row loop. Only where the block stores its innermost axis where it reads it (a
    conv2d's NCHW epilogue, ``out[n, f, y, x]`` from ``C[y * W + x, f]``, would store across
    channels inside the GEMM's tile). ``transform_block_layout`` refuses a map that is not a
    bijection of the iteration space (a read that skips or repeats iters), for every value
    of the symbolic extents, and leaves the block as it was."""
    stmt = sch.get(block)
    region = next((r.region for r in stmt.reads if r.source.same_as(buffer)), None)
    if region is None or any(iv.iter_type != tirx.IterVar.DataPar for iv in stmt.iter_vars):
        return False
    if not all(isinstance(rng.extent, tirx.IntImm) and rng.extent.value == 1 for rng in region):
        return False  # reads a range per element, not one element
    innermost = region[-1].min
    if not isinstance(innermost, tirx.Var) or not stmt.writes[0].region[-1].min.same_as(innermost):
        return False
    indices = [rng.min for rng in region if not isinstance(rng.min, tirx.IntImm)]
    try:
        index_map = tirx.IndexMap([iv.var for iv in stmt.iter_vars], indices, None)
        sch.transform_block_layout(block, index_map)
    except (s_tir.ScheduleError, ValueError):
        return False
    return True


def is_plain_load(sch: s_tir.Schedule, block: SBlockRV) -> bool:
    body = sch.get(block).body
    return isinstance(body, tirx.BufferStore) and isinstance(body.value, ir.TensorLoad)


def last_index_is_iter(sch: s_tir.Schedule, block: SBlockRV, iter_index: int) -> bool:
    """Whether the block copies a buffer whose innermost index is its ``iter_index``-th iter."""
    stmt = sch.get(block)
    if not is_plain_load(sch, block):
        return False
    return stmt.body.value.indices[-1].same_as(stmt.iter_vars[iter_index].var)


def splits_into_vectors(sch: s_tir.Schedule, loop: LoopRV, lanes: int) -> bool:
    """Whether the loop's extent is a constant multiple of ``lanes`` (a symbolic one never is:
    its tail would need a predicate on the vector axis)."""
    extent = loop_extent(sch, loop)
    return extent is not None and extent % lanes == 0


def schedule_injective(sch: s_tir.Schedule, block: SBlockRV, lanes: int) -> None:
    """A standalone elementwise/copy block: parallel outer loops, vectorised inner loop."""
    loops = sch.get_loops(block)
    if not loops:
        return
    inner = loops[-1]
    if len(loops) > 1 and splits_into_vectors(sch, inner, lanes):
        _, vec = sch.split(inner, [None, lanes])
        sch.vectorize(vec)
        outer = loops[:-1]
    else:
        outer = loops[:-1] if len(loops) > 1 else loops
    sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])


def is_plain_copy(block: s_tir.SBlock) -> bool:
    """Whether ``block`` stores one load indexed by plain variables: the only layout rewrite
    TVM's ``RemoveWeightLayoutRewriteBlock`` can take out of a kernel, which MetaSchedule
    does to time a kernel as it runs on a prepacked weight (a padded packing, an
    ``if_then_else``, makes it fail an internal check)."""
    body = block.body
    return (isinstance(body, tirx.BufferStore) and isinstance(body.value, ir.TensorLoad)
            and all(isinstance(i, tirx.Var) for i in body.value.indices))


def copies_a_constant(sch: s_tir.Schedule, block: SBlockRV, plain_only: bool = False) -> bool:
    """Whether ``block`` reads exactly one buffer and that buffer is a parameter every
    caller passes a constant (``LAYOUT_FREE_ATTR``, set by
    ``schedules.prepack_weights.mark_layout_free`` when weights are prepacked): a layout
    rewrite of it can run once, at compile time.  ``plain_only``: only a plain copy."""
    func = sch.mod["main"]
    if func.attrs is None or LAYOUT_FREE_ATTR not in func.attrs:
        return False
    stmt = sch.get(block)
    if len(stmt.reads) != 1 or len(stmt.writes) != 1 or (plain_only and not is_plain_copy(stmt)):
        return False
    source = stmt.reads[0].source
    return any(source.same_as(func.params[int(i)]) for i in func.attrs[LAYOUT_FREE_ATTR])


def mark_prepack(sch: s_tir.Schedule, block: SBlockRV, plain_only: bool = False) -> bool:
    """Mark ``block`` as a compile-time layout rewrite when it ``copies_a_constant``; True
    if marked.  ``plain_only`` (tuning's design spaces): only a plain copy, which
    MetaSchedule can time prepacked."""
    if not copies_a_constant(sch, block, plain_only):
        return False
    sch.annotate(block, PREPACK_ANNOTATION, tirx.IntImm("int32", 1))
    return True
