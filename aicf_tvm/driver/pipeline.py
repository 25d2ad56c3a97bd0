"""The pipeline (docs/design.md §1 flow), composed in one place: ``run_pipeline``.

The passes and their order are listed once, in docs/pipeline.md ("The passes, in order").
``verify_contracts`` runs after every step when ``CompileOptions.verify_each_pass`` asks
(by default under ``AICF_DEBUG=1``).

Every setting travels in one ``CompileOptions`` (``aicf_tvm.core.options``), passed to the
passes and schedule rules that read it; ``get_pipeline(options)`` is the same pipeline as a
``tvm.transform.Pass`` for ``tvm.compile(mod, target, relax_pipeline=...)``.

``compile``, ``aicf explain``, tuning (which stops at LowerEmits, so it measures exactly
the PrimFuncs ``compile`` schedules) and the optimizer step (which adds its Adam passes
around the fixpoint) all call ``run_pipeline``; the stage functions it calls are public
for tests and measurements of one stage.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax import vm_build

from aicf_tvm.core.errors import TargetError, UnsupportedModelError
from aicf_tvm.core.numerics import RELAXED
from aicf_tvm.core.options import CompileOptions, options_or_default
from aicf_tvm.core.report import Decision, FusionReport
from aicf_tvm.driver.compiled import compiled_model
from aicf_tvm.driver.verify import verify_contracts
from aicf_tvm.library import DEFAULT_CANDIDATES
from aicf_tvm.runtime.compiled import CompiledModel
from aicf_tvm.runtime.cuda_binary import precompiled
from aicf_tvm.runtime.targets import resolve_target
from aicf_tvm.runtime.threads import on_every_cpu, thread_count
from relax_passes import FuseEmits, LiftEmits, LowerEmits, PropagateContracts
from relax_passes.bound_shapes import BoundShapes
from relax_passes.bounded_tables import PrecomputeBoundedTables
from relax_passes.cache_in_place import CacheInPlace
from relax_passes.channels_first import ChannelsFirst
from relax_passes.clip_pool_windows import ClipPoolWindows
from relax_passes.combine_int4_calls import CombineInt4Calls
from relax_passes.combine_projections import CombineProjections
from relax_passes.conv1d_as_conv2d import Conv1dAsConv2d
from relax_passes.creation_ops import NormalizeCreationOps
from relax_passes.fast_fold import fold_constant_part
from relax_passes.fold_batch_norm import FoldBatchNorm
from relax_passes.fold_pad import FoldPadIntoConv
from relax_passes.group_query_heads import GroupQueryHeads
from relax_passes.ieee_fold import FoldConstantIEEE
from relax_passes.implicit_broadcasts import ImplicitBroadcasts
from relax_passes.index_checks import HostIndexChecks
from relax_passes.integer_qdq import integer_qdq
from relax_passes.normalize_indices import NormalizeIndices
from relax_passes.numeric_levels import RelaxNumerics
from relax_passes.rewrites import rewrite_passes
from relax_passes.single_pointer_noalias import SinglePointerNoAlias
from relax_passes.sink_reshapes import SinkReshapes
from schedules import ScheduleMemo, apply_default_schedules
from schedules.cpu.codegen import codegen_target
from schedules.cpu.common import float32_lanes
from schedules.cpu.comparisons import NaNExactComparisons
from schedules.cpu.conv2d_int8 import has_vnni, int8_dot
from schedules.cpu.ieee_arith import IEEEArithmetic
from schedules.cpu.int_arith import WrappingIntegers
from schedules.cpu.linear_int4 import KERNEL_FORMS as INT4_KERNEL_FORMS
from schedules.cpu.linear_int4 import for_target as int4_for_target
from schedules.cpu.linear_int4 import with_outputs as int4_with_outputs
from schedules.cpu.parallel_guard import tir_pipeline
from schedules.cpu.vector_math import VectorizeMath
from schedules.cuda import host_bound_kernels
from schedules.prepack_weights import mark_layout_free, prepack_weights
from schedules.select import apply_database

from .compile_cache import KernelCache, cache_for, cacheable, file_key, module_key
from .frontends import is_onnx_file, load_model
from .frontends.common import first_line
from .weights_apart import WeightsApart, lift_weights

MAX_ROUNDS = 4


def normalize(mod: tvm.IRModule, options: CompileOptions | None = None,
              report: FusionReport | None = None) -> tvm.IRModule:
    """Put pure bindings into dataflow blocks (``relax.transform.ConvertToDataflow``: a
    module built with ``BlockBuilder`` outside ``bb.dataflow()`` would otherwise keep every
    op out of the Emit passes, which lift only dataflow blocks), compute a QDQ model's
    quantized convolutions in integers where the target can (``relax_passes.integer_qdq``,
    each in ``report``) and its other quantize / dequantize ops as pointwise arithmetic, put the creation ops that
    TVM types or legalizes wrongly in forms it gets right (descending ``arange``, a
    non-finite ``full``: ``relax_passes.NormalizeCreationOps``), simplify symbolic shapes
    under their bounds (``relax_passes.BoundShapes``), make every
    gather read in bounds (``relax_passes.NormalizeIndices``: modules need not come through
    our importers), precompute float tables of bounded ``arange`` positions up to the bound
    (``relax_passes.PrecomputeBoundedTables``: a dynamic build's rotary tables), fold what
    is computable at compile time (weights, with IEEE float arithmetic:
    ``relax_passes.FoldConstantIEEE``; batch-norm into conv weights where exact,
    ``relax_passes.FoldBatchNorm``, which decomposes every other
    batch-norm by its own ``training`` flag before TVM's inference decomposition could
    misread it; zero pads into the convolutions that read them, ``relax_passes.FoldPadIntoConv``;
    an average pool's window that covers its whole input, to that input, ``relax_passes.ClipPoolWindows``),
    merge the projections of one input by constant weights that attention splits into
    heads into one GEMM whose output attention reads through slices, and read a ``split``
    through slices too (``relax_passes.CombineProjections``), and likewise the int4 kernels'
    calls of one input (``relax_passes.CombineInt4Calls``),
    let ops broadcast their operands themselves instead of through an explicit broadcast
    (``relax_passes.ImplicitBroadcasts``) and move reshapes below the pointwise ops they
    feed (``relax_passes.SinkReshapes``); ``options`` may leave out CombineProjections."""
    options = options_or_default(options)
    target = resolve_target(options.target) if options.target is not None else None
    llvm = target is not None and target.kind.name == "llvm"
    integer = options.qdq_integer and llvm and int8_dot(target) is not None
    convs = llvm and has_vnni(target)  # AVX2: integer matmuls, float convolutions
    seq = [
        relax.transform.ConvertToDataflow(min_size=1),
        tvm.transform.module_pass(lambda m, _ctx: integer_qdq(m, integer, report, convs), opt_level=0,
                                  name="IntegerQDQ"),
        NormalizeCreationOps(),
        BoundShapes(),
        FoldConstantIEEE(),
        NormalizeIndices(),
        PrecomputeBoundedTables(),
        FoldBatchNorm(),
        FoldPadIntoConv(),
        ClipPoolWindows(),
        FoldConstantIEEE(),
        relax.transform.DecomposeOpsForInference(),
        FoldConstantIEEE(),
        NormalizeIndices(),  # a check of indices that only the folds above made constant
        *([CombineProjections(), CombineInt4Calls(INT4_KERNEL_FORMS, int4_with_outputs)]
          if options.combine_projections else []),
        ImplicitBroadcasts(options),
        SinkReshapes(),
        *([GroupQueryHeads()] if options.group_query_heads else []),
        relax.transform.DeadCodeElimination(),
    ]
    return tvm.transform.Sequential(seq)(mod)


def layout_lanes(target: tvm.target.Target | None) -> int | None:
    """The float32 vector width that blocked channel layouts use on ``target``: LLVM CPUs
    with vectors of 8 lanes or more (AVX2, AVX-512); None elsewhere (layouts stay)."""
    if target is None or target.kind.name != "llvm":
        return None
    lanes = float32_lanes(target)
    return lanes if lanes >= 8 else None


def optimize(mod: tvm.IRModule, report: FusionReport, candidates: Sequence[Any] | None = None,
             check: Callable[[tvm.IRModule], None] | None = None,
             target: tvm.target.Target | None = None, *,
             options: CompileOptions | None = None) -> tvm.IRModule:
    """Lift, propagate, then rewrite to a fixpoint (bounded by ``MAX_ROUNDS``); with a
    target, convolution chains may take the target's blocked layouts (``layout_lanes``).
    ``candidates`` and ``target`` given replace those of ``options``."""
    options = options_or_default(options).updated(candidates=candidates, target=target)
    check = check or (verify_contracts if options.verify_each_pass else (lambda m: None))
    lanes = layout_lanes(options.target)
    if lanes is not None:  # channels-last islands and 1-D convolutions join the blockable chains
        mod = ChannelsFirst()(SinkReshapes()(Conv1dAsConv2d()(mod)))
    mod = PropagateContracts()(LiftEmits()(mod))
    check(mod)
    candidates = tuple(DEFAULT_CANDIDATES if options.candidates is None else options.candidates)
    fuse = FuseEmits(candidates, report=report)
    for _ in range(MAX_ROUNDS):
        before = mod
        for rewrite in [*rewrite_passes(report, candidates=candidates, lanes=lanes), fuse]:
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


def lower_emits(mod: tvm.IRModule, target: tvm.target.Target,
                options: CompileOptions | None = None) -> tvm.IRModule:
    """LowerEmits for ``target``: one unscheduled PrimFunc per Emit (what tuning measures)."""
    return LowerEmits(options_or_default(options).updated(target=target))(mod)


def schedule(kernels: tvm.IRModule, target: tvm.target.Target, database: Any = None,
             report: FusionReport | None = None, *, vector_math: bool = True,
             choices: Mapping[str, dict] | None = None,
             options: CompileOptions | None = None, memo: ScheduleMemo | None = None) -> tvm.IRModule:
    """Kernel selection, weight prepacking and VectorizeMath; returns the module ready to build.

    ``choices`` replaces the tuning outcomes of the work dir ``database`` (``apply_database``).
    ``options`` carries the schedule rules' knobs (its target and database yield to the
    arguments). ``memo``: the kernel cache (``compile_cache.KernelCache``) the default
    schedules are taken from and recorded in.

    ``vector_math=False`` leaves transcendental calls to libm (to measure what
    ``VectorizeMath`` gains; both keep the ``exact`` contract, docs/numerics.md).
    """
    options = options_or_default(options).updated(target=target, database=database)
    database = options.database
    vector_math = vector_math and options.vector_math
    with target:
        # on a copy (the passes below set functions in place): tuning schedules one
        # module of kernels again and again, with other records each time
        mod = mark_layout_free(kernels.clone())  # before the records: tuning saw the kernels marked
        if database is not None:  # records are keyed by the PrimFuncs as tuning saw them
            mod = apply_database(mod, target, database, choices, options)  # records of these knobs
        mod = apply_default_schedules(target, options, memo)(mod)
        mod = int4_for_target(mod, target)  # the int4 GEMVs' form for this target's vectors
        packed, refused = [], []
        if options.prepack_weights:
            # each kernel's packing folded by FoldConstant on the compile-time part of the
            # module only (relax_passes.fast_fold), not on every call of it
            mod, packed, refused = prepack_weights(mod, partial(fold_constant_part, relax.transform.FoldConstant()))
        mod = NaNExactComparisons(target)(mod)  # what the schedules inlined keeps IEEE NaN results
        if options.ieee_arithmetic:  # float + - * / kept from the simplifier and contraction
            mod = IEEEArithmetic(target)(mod)
        mod = WrappingIntegers(target)(mod)  # integer + - * on values wrap, fused or not
        if vector_math:  # exp/erf/tanh/... as SIMD arithmetic, not one libm call per lane
            mod = VectorizeMath(target)(mod)
    if report is not None:
        for p in packed:
            report.add(Decision("materialize:layout_transform", (p.kernel,), True, note=p.describe()))
        for r in refused:
            report.add(Decision("materialize:layout_transform", (r.kernel,), False, note=r.describe()))
    return mod


def device_checks(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """On a GPU target, index checks moved to the host and every kernel bound to GPU threads
    (``UnsupportedModelError`` otherwise); the module as it is elsewhere."""
    if "gpu" in target.keys:  # a GPU kernel cannot call the host to raise: check on the host
        mod = HostIndexChecks()(mod)
    if "gpu" in target.keys and (unbound := host_bound_kernels(mod)):
        raise UnsupportedModelError(
            f"kernel(s) {', '.join(unbound)} have no GPU schedule (a loop bound to no GPU thread "
            f"would run on the host over device memory); no rule of {target.kind.name} applies")
    return mod


def build(mod: tvm.IRModule, target: tvm.target.Target, code: KernelCache | None = None) -> Any:
    """The executable of ``mod`` for ``target``; ``code``: where a CPU build finds the
    code (LLVM IR) of kernels built before (``build_in_parts``)."""
    mod = device_checks(mod, target)
    passes = backend_passes(target)
    # CPU kernels decide per call whether a symbolic-size parallel loop is worth the pool
    tir = "default" if "gpu" in target.keys else tir_pipeline()
    # LLVM's vectorizers kept from gathers on x86: the same results, faster row reductions
    machine = codegen_target(target)
    if "gpu" not in target.keys and target.kind.name == "llvm":
        return build_in_parts(mod, machine, tvm.transform.Sequential(passes), tir, code)
    with machine, precompiled(target):  # CUDA kernels exported compiled, not as source
        return tvm.compile(mod, target=machine, relax_pipeline=tvm.transform.Sequential(passes),
                           tir_pipeline=tir)


MAX_KERNEL_MODULES = 64  # beyond it, kernels share LLVM modules (each module has its own few helpers)


def build_in_parts(mod: tvm.IRModule, target: tvm.target.Target, relax_pipeline: tvm.transform.Pass,
                   tir: Any, code: KernelCache | None = None) -> relax.VMExecutable:
    """``tvm.compile(mod, target, relax_pipeline, tir_pipeline=tir)`` with each kernel in an
    LLVM module of its own (up to ``MAX_KERNEL_MODULES``), built by one thread per CPU
    (``threads.on_every_cpu``: TVM's builds release the GIL). LLVM writes the machine code of one module in one
    thread: with the kernels apart, the JIT (``runtime.compiled.jit_in_parallel``) and the
    export (``runtime.deploy``) run on every core; BERT's JIT took 3.8-4.6 s instead of
    4.6-6.5 s on 2 cores, its four GEMMs most of it. The modules are ordered largest IR
    first (its JSON's length), so that the last one a thread takes is a small one; the VM
    finds a kernel in whichever module holds it (they are imports of its executable).
    ``code`` (the kernel cache) gives a module built before from the same kernels, read
    from its LLVM IR (``KernelCache.get_code``), and keeps each one built here."""
    with target:
        mod = relax_pipeline(mod)
    attrs = dict(mod.attrs) if mod.attrs else {}
    lifted = lift_weights(mod)
    builder = relax.ExecBuilder()
    mod = vm_build._vmcodegen(builder, mod, "bytecode")
    kernels = sorted(((len(tvm.ir.save_json(f)), gv, f) for gv, f in mod.functions.items()
                      if isinstance(f, tvm.tirx.PrimFunc)), key=lambda k: (-k[0], k[1].name_hint))
    groups: list[dict] = [{} for _ in range(min(MAX_KERNEL_MODULES, len(kernels)))]
    sizes = [0] * len(groups)
    for size, gv, func in kernels:  # the largest first, each to the least filled module
        at = sizes.index(min(sizes))
        groups[at][gv], sizes[at] = func, sizes[at] + size
    context = tvm.transform.PassContext.current()

    def one(group: dict) -> tvm.runtime.Module:
        part = tvm.IRModule(group, attrs=mod.attrs)
        if code is not None and (lib := code.get_code(part, target, context)) is not None:
            return lib
        with context, target:  # both are per thread
            lib = tvm.tirx.build(part, target=target, pipeline=tir)
        if code is not None:
            code.put_code(part, target, context, lib)
        return lib

    libs = on_every_cpu(one, groups)

    def link(builder: relax.ExecBuilder) -> relax.VMExecutable:
        return relax.VMExecutable(vm_build._ffi_api.VMLink(builder, target, libs[0] if libs else None,
                                                           [*libs[1:], *attrs.get("external_mods", [])],
                                                           dict(attrs.get("const_name_to_constant", {}))))

    executable = link(builder)
    if lifted is not None:  # the same kernels, the weights passed in (what an export writes)
        apart = relax.ExecBuilder()
        vm_build._vmcodegen(apart, lifted[0], "bytecode")
        executable.weights_apart = WeightsApart(link(apart), lifted[1])
    return executable


def backend_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """The backend's dataflow lowering and finalization for ``target``, as ``build`` runs them."""
    backend = _backend(target)
    # the VM's shape function would switch off noalias for every kernel (see the pass)
    return [*backend.dataflow_lower_passes(target), *backend.finalize_passes(target), SinglePointerNoAlias]


STAGES = ("optimize", "kernels", "schedule", "build")

Pass = Callable[[tvm.IRModule], tvm.IRModule]


@dataclass
class Stages:
    """What one run of the pipeline made, stage by stage (None: a stage not run)."""

    report: FusionReport
    optimized: tvm.IRModule  # the Emits after the fusion fixpoint
    kernels: tvm.IRModule | None = None  # one unscheduled PrimFunc per Emit
    lowered: tvm.IRModule | None = None  # scheduled, ready to build
    executable: Any = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase, in order


def format_timings(timings: Mapping[str, float]) -> str:
    """The phase table ``compile(..., timings=True)`` and ``aicf compile --timings`` print."""
    total = sum(timings.values())
    rows = [f"  {name:<10} {secs:8.2f} s  {secs / total:6.1%}" for name, secs in timings.items()] if total else []
    return "\n".join(["compile phases:", *rows, f"  {'total':<10} {total:8.2f} s"])


def run_pipeline(mod: tvm.IRModule, target: tvm.target.Target | None = None, *, until: str = "build",
                 database: Any = None, report: FusionReport | None = None,
                 candidates: Sequence[Any] | None = None, before_optimize: Sequence[Pass] = (),
                 after_optimize: Sequence[Pass] = (), vector_math: bool = True,
                 options: CompileOptions | None = None, memo: ScheduleMemo | None = None) -> Stages:
    """Run the pipeline on ``mod`` for ``target`` up to stage ``until`` (one of ``STAGES``).

    ``options`` carries every setting; ``target``, ``database`` and ``candidates`` given
    replace its own (``vector_math=False`` switches VectorizeMath off whatever it says).
    ``before_optimize`` passes run between normalize and the fusion fixpoint,
    ``after_optimize`` ones after it (the optimizer step's Adam passes); ``report``
    (a fresh one by default) collects every decision; ``memo`` is the kernel cache
    (``schedule``, ``build``).
    """
    options = options_or_default(options).updated(target=target, database=database, candidates=candidates)
    if options.target is None:
        raise ValueError("run_pipeline: no target (pass one, or options with one)")
    target = resolve_target(options.target)
    options = options.updated(target=target, vector_math=options.vector_math and vector_math)
    if until not in STAGES:
        raise ValueError(f"until={until!r}: not one of {', '.join(STAGES)}")
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise UnsupportedModelError("the module has no 'main' function")
    report = FusionReport() if report is None else report
    clock = _Clock()
    mod = clock("normalize", normalize, mod, options, report)
    for step in before_optimize:
        mod = step(mod)
    mod = clock("fuse", optimize, mod, report, options=options)  # lift, propagate, the fixpoint
    mod = CacheInPlace(report)(mod)  # donated caches written in place (lowers those writes)
    if options.numerics == RELAXED:  # the Emits the level changes, each recorded as an approximation
        mod = RelaxNumerics(report)(mod)
    for step in after_optimize:
        mod = step(mod)
    stages = Stages(report, mod, timings=clock.timings)
    if until == "optimize":
        return stages
    stages.kernels = clock("lower", lower_emits, mod, target, options)
    if until == "kernels":
        return stages
    stages.lowered = clock("schedule", schedule, stages.kernels, target, report=report, options=options, memo=memo)
    if until == "build":
        stages.executable = clock("codegen", build, stages.lowered, target, memo)
    return stages


class _Clock:
    """Calls a phase and adds its wall time to ``timings`` under its name."""

    def __init__(self, timings: dict[str, float] | None = None) -> None:
        self.timings = {} if timings is None else timings

    def __call__(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        except tvm.error.InternalError as err:
            if name not in GRAPH_PHASES:
                raise
            # TVM's own check failing on a model's graph (its analyzer on shapes a NonZero
            # count makes): the model is refused by name of the phase, not with a bare crash
            raise UnsupportedModelError(f"TVM failed while compiling the model ({name}): "
                                        f"{first_line(err)}") from err
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start


GRAPH_PHASES = ("import", "normalize", "fuse")  # phases on the model's graph, before kernels exist


def compile(mod: Any, target: Any = None, database: Any = None, *, candidates: Sequence[Any] | None = None,
            threads: int | None = None, options: CompileOptions | None = None,
            timings: bool = False, warm_up: bool = True, cache: bool = True,
            cache_dir: str | os.PathLike | None = None, import_args: Mapping[str, Any] | None = None,
            progress: Callable[[], None] | None = None, numerics: str | None = None) -> CompiledModel:
    """Compile a Relax IRModule (or anything ``load_model`` accepts, imported with
    ``import_args``: its ``shapes=`` and ``bounds=``) to a ``CompiledModel`` that runs with
    ``threads`` CPU threads (default: ``aicf_tvm.runtime.threads.thread_count``).

    ``options`` carries every setting (``CompileOptions``); ``target`` (default ``"llvm"``),
    ``database``, ``candidates``, ``threads`` and ``numerics`` (the numeric level, "exact" or
    "relaxed": docs/numerics.md) given replace its own. The model's
    ``timings`` holds the seconds of each phase (import, normalize, fuse, lower, schedule,
    codegen, jit, cache); ``timings=True`` also prints them (``format_timings``) to stderr.
    ``warm_up`` (phase "jit", ``CompiledModel.warm_up``) makes the machine code of the
    kernels for this process now, so that the first call runs as fast as later ones;
    ``False`` where the model is only exported (which writes its own object code).

    ``cache`` (on by default; ``cache_dir`` moves it): a model compiled before with the
    same options, target and versions is loaded from the compile cache instead, and a
    model compiled here is exported into it (``aicf_tvm.driver.compile_cache``). A model
    from the cache is a loaded library: it has no ``optimized`` or ``lowered`` module
    (``cache=False`` keeps them). ``progress`` is called once the model is imported and
    not found in the cache, as the compile proper starts (``aicf compile``'s status line)."""
    options = options_or_default(options).updated(target=target, database=database, candidates=candidates,
                                                  threads=threads, numerics=numerics)
    tgt = resolve_target("llvm" if options.target is None else options.target)
    options = options.updated(target=tgt)
    threads = options.threads
    thread_count(threads)  # a bad count fails now, not after the build
    clock = _Clock()
    store = cache_for(cache, cache_dir) if cacheable(options, tgt) else None
    entry = None
    if store is not None and isinstance(mod, (str, os.PathLike)) and is_onnx_file(mod):
        entry = clock("cache", file_key, mod, dict(import_args or {}), options, tgt)
        if (hit := clock("cache", store.get, entry, threads)) is not None:
            return _done(hit, dict(clock.timings), timings)
    if not isinstance(mod, tvm.IRModule):
        mod = clock("import", load_model, mod, **(import_args or {}))
    # main's outputs and dim requirements as typed right: Relax types a descending arange
    # longer than it is, and its length would be required non-negative (creation_ops)
    mod = NormalizeCreationOps()(mod)
    if store is not None and entry is None:
        entry = clock("cache", module_key, mod, options, tgt)
        if (hit := clock("cache", store.get, entry, threads)) is not None:
            return _done(hit, dict(clock.timings), timings)
    if progress is not None:
        progress()
    stages = run_pipeline(mod, options=options, memo=None if store is None else KernelCache(store, options))
    model = compiled_model(stages.executable, tgt, mod["main"], report=stages.report, lowered=stages.lowered,
                           optimized=stages.optimized, threads=threads)
    clock = _Clock({**clock.timings, **stages.timings})
    if store is not None:
        # the library written once: an export of this model copies it (CompiledModel.exported)
        model.exported = clock("cache", store.put, entry, model)
    if warm_up:
        # the machine code of the library just written, where there is one: the JIT would
        # generate the same code a second time (BERT: 4.2 s, the library's load 1.9 s)
        clock("jit", model.run_from_library)
    return _done(model, clock.timings, timings)


def _done(model: CompiledModel, phases: dict[str, float], show: bool) -> CompiledModel:
    """``model`` with its phase timings, printed (``format_timings``) when ``show``."""
    model.timings = phases
    if show:
        print(format_timings(phases), file=sys.stderr)
    return model


def get_pipeline(options: CompileOptions | None = None, *, report: FusionReport | None = None,
                 finalize: bool = True) -> tvm.transform.Pass:
    """What ``compile`` does to the module before it builds, as a module pass: normalize,
    the fusion fixpoint, LowerEmits and kernel selection (``run_pipeline`` up to
    "schedule"), then, with ``finalize``, ``device_checks`` and the backend's dataflow
    lowering and finalization, so that ``tvm.compile(mod, target,
    relax_pipeline=get_pipeline(options))`` builds it.  ``finalize=False`` stops at the
    scheduled kernels, for a pipeline that lowers by itself.

    The target is ``options.target``, else the enclosing ``with target:`` (``tvm.compile``
    enters its own); ``report`` collects the decisions.  ``tvm.compile`` builds with its
    own TIR pipeline and codegen target: ``compile`` adds ``GuardSmallParallel`` to the
    first, keeps LLVM's vectorizers from gathers in the second and exports CUDA kernels
    compiled (``build``).
    """
    options = options_or_default(options)

    @tvm.transform.module_pass(opt_level=0, name="AICFPipeline")
    def aicf_pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        target = options.target if options.target is not None else tvm.target.Target.current(allow_none=True)
        if target is None:
            raise TargetError("get_pipeline: no target; set CompileOptions.target, or run the pass "
                              "inside `with target:` (tvm.compile enters its target)")
        target = resolve_target(target)
        lowered = run_pipeline(NormalizeCreationOps()(mod), until="schedule", report=report,
                               options=options.updated(target=target)).lowered
        if not finalize:
            return lowered
        return tvm.transform.Sequential(backend_passes(target))(device_checks(lowered, target))

    return aicf_pipeline
