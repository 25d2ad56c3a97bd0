"""Our default rules as MetaSchedule design spaces, and kernels in the form they are timed.

A rule that supports tuning answers ``apply(func, target, tunable=True)`` with a list of
schedules (``gemm.gemm_spaces``): one per structural choice around its default plan (the
register tile ``mr x nr``, whether B is packed, which loops run in parallel:
``gemm_plan.plan_candidates``), the default plan's first, each sampling its block sizes
(``mc``, ``nc``, ``kc``) with ``sample_perfect_tile`` whose decision is the plan's.
``design_spaces`` returns them for the rule that schedules the workload by default (the
rules built with the run's ``CompileOptions``, as ``compile`` builds them), and
``space_generator`` gives them to MetaSchedule as a ``ScheduleFn`` whose one mutator is
``MutateTileSize``.  The evolutionary search then mutates the block sizes of measured
records, the default plan's seeded trace among them (``tune.seed_default``), and samples
the structural neighbours; a record replays on our own schedule, so ``compile`` builds the
kernel MetaSchedule measured.  A rule may instead return complete schedules that sample
nothing (``BlockedConv2d``'s plans): ``space_count`` counts them, and tuning measures each
in place of a search.  No postprocessor runs: the rule's schedule is complete
(parallel, vectorised, reduction decomposed), and TVM's ``RewriteLayout`` would pack B a
second time.  A workload no tunable rule takes is searched in MetaSchedule's own space.

``timed_form`` is a kernel as tuning times it: like ``compile``, which splits a constant
weight's packing out of the kernel and runs it once (``schedules.prepack_weights``),
MetaSchedule times a kernel without its marked layout rewrites, but it can only remove a
plain copy (``gemm_blocks.is_plain_copy``).  A padded packing is timed as the copy of the
load inside it, which costs the same once removed; one without such a load keeps packing.
"""

from __future__ import annotations

import logging
from typing import Any

import tvm
import tvm_ffi
from tvm import ir, s_tir, tirx
from tvm.s_tir import meta_schedule as ms

from aicf_tvm.core.options import CompileOptions
from schedules import default_rules
from schedules.cpu.gemm_blocks import PREPACK_ANNOTATION, is_plain_copy

_LOG = logging.getLogger(__name__)


def design_spaces(workload: tvm.IRModule, target: tvm.target.Target,
                  options: CompileOptions | None = None) -> list[s_tir.Schedule] | None:
    """The design spaces of the rule that schedules ``workload`` by default (the rules
    with the knobs of ``options``, as ``compile`` builds them), when that rule has tunable
    ones; None otherwise (MetaSchedule's own space is searched)."""
    func = workload["main"]
    for rule in default_rules(target, options):
        try:
            if rule.apply(func, target, False) is None:
                continue
            spaces = rule.apply(func, target, True)
        except Exception as err:  # noqa: BLE001 - a failing rule is skipped, as at compile time
            _LOG.warning("rule %r failed on a tuning workload: %s", rule, err)
            continue
        return spaces if isinstance(spaces, list) and spaces else None
    return None


def space_count(spaces: list[s_tir.Schedule] | None) -> int | None:
    """The candidates besides the default in ``spaces`` when none samples a decision (each
    is one kernel, measured as it is: ``BlockedConv2d``'s); None when they are searched
    (sampled block sizes) or there are none (MetaSchedule's own space)."""
    if not spaces or any(space.trace.decisions for space in spaces):
        return None
    return len(spaces) - 1


def space_generator(spaces: list[s_tir.Schedule]) -> ms.space_generator.SpaceGenerator:
    """MetaSchedule's view of ``spaces``: their traces, block sizes mutated."""
    return ms.space_generator.ScheduleFn(
        lambda _sch: [space.copy() for space in spaces],
        sch_rules=[], postprocs=[], mutator_probs={ms.mutator.MutateTileSize(): 1.0},
    )


def has_unplain_rewrite(mod: tvm.IRModule) -> bool:
    """Whether a PrimFunc of ``mod`` marks a layout rewrite MetaSchedule cannot remove."""
    found: list[s_tir.SBlock] = []

    def visit(block: s_tir.SBlock) -> None:
        if PREPACK_ANNOTATION in block.annotations and not is_plain_copy(block):
            found.append(block)

    for _, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc):
            tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, visit)])
    return bool(found)


def _timed_block(block: s_tir.SBlock) -> s_tir.SBlock:
    """A marked layout rewrite MetaSchedule cannot remove, as the plain copy of its source
    load it stands for (timing only: the padding is gone); unmarked if it has none."""
    if PREPACK_ANNOTATION not in block.annotations or is_plain_copy(block):
        return block
    source = block.reads[0].source
    loads: list[Any] = []
    store = block.body
    if isinstance(store, tirx.BufferStore):
        tvm_ffi.structural_walk(store.value, [(ir.TensorLoad, loads.append)])
    plain = [x for x in loads if x.source.same_as(source) and all(isinstance(i, tirx.Var) for i in x.indices)]
    annotations = dict(block.annotations)
    if plain and str(plain[0].ty) == str(store.value.ty):
        body = tirx.BufferStore(store.buffer, plain[0], store.indices)
    else:
        body = store
        annotations.pop(PREPACK_ANNOTATION)
    return s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body, block.init,
                        block.alloc_buffers, block.match_buffers, annotations)


def timed_form(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each marked layout rewrite in a form MetaSchedule's timing removes."""
    if not has_unplain_rewrite(mod):
        return mod
    out = {}
    for gv, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc):
            func = tvm_ffi.structural_map(func, [(s_tir.SBlock, _timed_block)])
        out[gv] = func
    return tvm.IRModule(out, attrs=mod.attrs)
