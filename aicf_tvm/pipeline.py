"""compile: a Relax module to a runnable, reportable CompiledModel (docs/design.md §1 flow).

normalize -> LiftEmits -> PropagateContracts -> (EliminateEmits, FuseEmits,
MaterializeEmits, PropagateContracts)* to a bounded fixpoint -> LowerEmits ->
kernel selection (tuned record, else default rule, else fallback) -> VectorizeMath
(float32 transcendental calls as vectorizable arithmetic) -> the backend's own dataflow
lowering -> ``tvm.compile``. ``verify_contracts`` runs after every step
under ``AICF_DEBUG=1``.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import tvm
import tvm_ffi
from tvm import relax

from .errors import UnsupportedModelError
from .report import Decision, FusionReport
from .targets import resolve_target
from .verify import verify_contracts

MAX_ROUNDS = 4


def normalize(mod: tvm.IRModule) -> tvm.IRModule:
    """Simplify symbolic shapes under their bounds (``relax_passes.BoundShapes``), make every
    gather read in bounds (``relax_passes.NormalizeIndices``: modules need not come through
    our importers), fold what is computable at compile time (weights; batch-norm into conv
    weights where exact, ``relax_passes.FoldBatchNorm``, which decomposes every other
    batch-norm by its own ``training`` flag before TVM's inference decomposition could
    misread it), let ops broadcast their operands themselves instead of through an
    explicit broadcast (``relax_passes.ImplicitBroadcasts``) and move reshapes below the
    pointwise ops they feed (``relax_passes.SinkReshapes``)."""
    from relax_passes.bound_shapes import BoundShapes
    from relax_passes.fold_batch_norm import FoldBatchNorm
    from relax_passes.implicit_broadcasts import ImplicitBroadcasts
    from relax_passes.normalize_indices import NormalizeIndices
    from relax_passes.sink_reshapes import SinkReshapes

    seq = [
        BoundShapes(),
        relax.transform.FoldConstant(),
        NormalizeIndices(),
        FoldBatchNorm(),
        relax.transform.FoldConstant(),
        relax.transform.DecomposeOpsForInference(),
        relax.transform.FoldConstant(),
        ImplicitBroadcasts(),
        SinkReshapes(),
        relax.transform.DeadCodeElimination(),
    ]
    return tvm.transform.Sequential(seq)(mod)


def _debug() -> bool:
    return os.environ.get("AICF_DEBUG", "") not in ("", "0")


def optimize(mod: tvm.IRModule, report: FusionReport, candidates: Sequence[Any] | None = None,
             check: Callable[[tvm.IRModule], None] | None = None) -> tvm.IRModule:
    """Lift, propagate, then rewrite to a fixpoint (bounded by ``MAX_ROUNDS``)."""
    from relax_passes import FuseEmits, LiftEmits, PropagateContracts
    from relax_passes.rewrites import rewrite_passes

    check = check or (verify_contracts if _debug() else (lambda m: None))
    mod = PropagateContracts()(LiftEmits()(mod))
    check(mod)
    fuse = FuseEmits(report=report) if candidates is None else FuseEmits(tuple(candidates), report=report)
    for _ in range(MAX_ROUNDS):
        before = mod
        for rewrite in [*rewrite_passes(report, before=True, candidates=candidates), fuse, *rewrite_passes(report, before=False)]:
            mod = PropagateContracts()(rewrite(mod))
            check(mod)
        if tvm_ffi.structural_equal(before, mod):
            break
    return mod


def _backend(target: tvm.target.Target):
    if "gpu" in target.keys:
        from tvm.relax.backend.cuda import pipeline as backend
    else:
        from tvm.relax.backend.cpu_generic import pipeline as backend
    return backend


def lower(mod: tvm.IRModule, target: tvm.target.Target, database: Any = None,
          report: FusionReport | None = None, *, vector_math: bool = True) -> tvm.IRModule:
    """LowerEmits, kernel selection and scheduling; returns the module ready to build.

    ``vector_math=False`` leaves transcendental calls to libm (to measure what
    ``VectorizeMath`` gains; both keep the ``exact`` contract, docs/numerics.md).
    """
    from relax_passes import LowerEmits
    from relax_passes.prepack_weights import mark_layout_free, prepack_weights
    from schedules import apply_default_schedules
    from schedules.cpu.vector_math import VectorizeMath
    from schedules.select import apply_database

    with target:  # LowerEmits dispatches sort/scan ops for the target
        mod = LowerEmits()(mod)
        if database is not None:  # records are keyed by the PrimFuncs as tuning saw them
            mod = apply_database(mod, target, database)
        mod = apply_default_schedules(target)(mark_layout_free(mod))
        mod, packed, refused = prepack_weights(mod)
        if vector_math:  # exp/erf/tanh/... as SIMD arithmetic, not one libm call per lane
            mod = VectorizeMath(target)(mod)
    if report is not None:
        for p in packed:
            report.add(Decision("materialize:layout_transform", (p.kernel,), True, note=p.describe()))
        for r in refused:
            report.add(Decision("materialize:layout_transform", (r.kernel,), False, note=r.describe()))
    return mod


def build(mod: tvm.IRModule, target: tvm.target.Target) -> Any:
    from relax_passes.single_pointer_noalias import SinglePointerNoAlias

    backend = _backend(target)
    # the VM's shape function would switch off noalias for every kernel (see the pass)
    passes = [*backend.dataflow_lower_passes(target), *backend.finalize_passes(target), SinglePointerNoAlias]
    with target:
        return tvm.compile(mod, target=target, relax_pipeline=tvm.transform.Sequential(passes))


def compile(mod: Any, target: Any = "llvm", database: Any = None, *, candidates: Sequence[Any] | None = None,  # noqa: A001
            threads: int | None = None):
    """Compile a Relax IRModule (or anything ``load_model`` accepts) to a ``CompiledModel``
    that runs with ``threads`` CPU threads (default: ``aicf_tvm.threads.thread_count``)."""
    from .compiled import CompiledModel
    from .frontends import load_model
    from .threads import thread_count

    tgt = resolve_target(target)
    thread_count(threads)  # a bad count fails now, not after the build
    mod = load_model(mod) if not isinstance(mod, tvm.IRModule) else mod
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise UnsupportedModelError("the module has no 'main' function")
    report = FusionReport()
    source = mod
    mod = optimize(normalize(mod), report, candidates)
    optimized = mod
    lowered = lower(mod, tgt, database, report)
    ex = build(lowered, tgt)
    return CompiledModel(ex, tgt, source["main"], report=report, lowered=lowered, optimized=optimized,
                         threads=threads)
