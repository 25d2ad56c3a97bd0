"""MetaSchedule tuning of Emit PrimFuncs, one task per contract signature (docs/design.md §7).

A kernel with symbolic extents is tuned in its rule's choices instead, timed at
representative bindings of its dims (``tune_symbolic``).

``extract_tasks`` turns lowered modules (after ``LowerEmits``, before any schedule) into
tasks: one per distinct ``select.workload_of`` workload, which is keyed by the Emit's
contract signature, so a kernel shared by several models is tuned once; they are ordered
by cost (estimated FLOPs times calls per inference), costliest first.  A task is seeded
with its measured default schedule (``tune_measure``), then ``search`` runs MetaSchedule
(evolutionary search, xgboost cost model) for its trials: in our default rule's design
spaces when it has them (``tune_space``), else in MetaSchedule's own.  A run killed
midway and started again loses nothing: MetaSchedule's JSON database appends every
measured batch as it goes.

A batch in which no candidate built raises ``TuningFailed`` with the builder's message.
A search that raises (MetaSchedule's own rules failing on a workload) raises
``SearchFailed``: the run goes on, the task keeping what it measured before.
A candidate that crashes the runner's worker process (a segfault) or runs past
``runner_timeout`` seconds is recorded as failed (MetaSchedule commits it with run_secs
1e10, which ``valid_records`` skips) and the search goes on: the runner kills its worker
and starts a fresh one for the next candidate.
The build function skips ``import tvm.s_tir.tensor_intrin`` on LLVM targets: that import
alone takes longer per build worker than MetaSchedule's default builder
timeout (docs/design.md §9); it applies ``NaNExactComparisons`` and ``VectorizeMath`` as
``compile`` does, so a candidate is
timed with the math code it will run.  Every step takes the run's ``CompileOptions``: the
workloads are keyed by its knobs (``select.workload_of``), the default schedules and the
rules' choices come from ``default_rules(target, options)``, and the builder leaves out
``IEEEArithmetic`` and ``VectorizeMath`` where the options do, as ``compile`` does.
``Tools(..., tracker=...)`` measures on the servers of a TVM RPC
tracker instead of this machine (``schedules.tuning.remote``).  Imports only TVM, the standard
library and this package.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import logging
import math
import os
import sys
import time
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.analysis import estimate_tir_flops

from aicf_tvm.core.errors import TuningError
from aicf_tvm.core.options import CompileOptions
from schedules import default_rules
from schedules.cpu.codegen import codegen_target
from schedules.cpu.comparisons import NaNExactComparisons
from schedules.cpu.ieee_arith import IEEEArithmetic
from schedules.cpu.int_arith import WrappingIntegers
from schedules.cpu.parallel_guard import tir_pipeline
from schedules.cpu.vector_math import VectorizeMath
from schedules.select import SIGNATURE_ATTR, contract_signature, replay, workload_of
from schedules.tuning.space import space_generator

from .choices import tunable_rule
from .remote import RemoteRunner, Tracker

_LOG = logging.getLogger(__name__)
FAILED_SECS = 1e9  # MetaSchedule stores failed candidates with run_secs of 1e10


class TuningFailed(TuningError, RuntimeError):
    """No candidate of a tuning batch built or ran; the message says why."""


class SearchFailed(TuningError, RuntimeError):
    """MetaSchedule's search raised for a task (its own schedule rules can fail on a
    workload they do not foresee: a ``reverse_compute_at`` on Whisper's attention); the
    task keeps what was measured before, its default schedule among it."""


@dataclass
class Task:
    """One tuning task: a workload and the kernels (model, PrimFunc name) that share it."""

    key: str
    workload: tvm.IRModule
    signature: dict
    flops: float
    uses: list[tuple[str, str]] = field(default_factory=list)
    calls: int = 0  # calls per inference, summed over the models
    # symbolic extents: the bindings it is timed at (``tune_symbolic``); empty: static
    bindings: list[dict[str, int]] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return str(self.signature["kind"])

    @property
    def cost(self) -> float:
        """Estimated FLOPs per inference: what a share of the trial budget follows."""
        return self.flops * max(1, self.calls)


def _flops(func: tirx.PrimFunc) -> float:
    try:
        return float(estimate_tir_flops(tvm.IRModule({"main": func})))
    except Exception:  # noqa: BLE001 - only used to order tasks and share trials
        return 0.0


def symbolic_dims(func: tirx.PrimFunc) -> list[str]:
    """Names of the symbolic extents of ``func``'s buffer parameters and of its scalar ones
    (a caller's var a fused group passes as ``tir_vars``; none: static)."""
    names: list[str] = []
    for param in func.params:
        scalar = isinstance(param.ty, tvm.ir.PrimType) and str(param.ty.dtype).startswith("int")
        if scalar and param.name not in names:
            names.append(param.name)
        for dim in getattr(getattr(param, "ty", None), "shape", None) or []:
            for var in tirx.analysis.undefined_vars(dim) if not isinstance(dim, tirx.IntImm) else []:
                if var.name not in names:
                    names.append(var.name)
    return names


def extract_tasks(lowered: list[tuple[str, tvm.IRModule]], target: tvm.target.Target,
                  calls: Mapping[tuple[str, str], int] | None = None,
                  bindings: Mapping[tuple[str, str], list[dict[str, int]]] | None = None,
                  options: CompileOptions | None = None) -> list[Task]:
    """Tasks of the Emit PrimFuncs of ``(model name, lowered module)`` pairs, costliest
    first; ``calls`` maps (model, PrimFunc name) to its calls per inference (default 1).
    A kernel with symbolic extents (``symbolic_dims``) is a task only when ``bindings``
    gives the bindings to time it at and its default rule offers choices
    (``tune_symbolic``); otherwise it keeps its default schedule.  The workloads are keyed
    by the knobs of ``options`` and the rules built with them (``select.workload_of``)."""
    tasks: dict[int, Task] = {}
    for model, mod in lowered:
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc):
                continue
            timed_at = (bindings or {}).get((model, gv.name_hint), []) if symbolic_dims(func) else []
            if symbolic_dims(func) and not timed_at:
                continue
            workload = workload_of(func, target, options)
            if workload is None or (timed_at and tunable_rule(workload["main"], target, options) is None):
                continue
            shash = tvm_ffi.structural_hash(workload)
            if shash not in tasks:
                key = str(workload["main"].attrs[SIGNATURE_ATTR])
                sig = contract_signature(func, target)
                # a symbolic extent counts as 1 in TVM's estimate: scaled by the largest binding
                scale = math.prod(timed_at[-1].values()) if timed_at else 1
                tasks[shash] = Task(key, workload, sig, _flops(workload["main"]) * scale, bindings=timed_at)
            tasks[shash].uses.append((model, gv.name_hint))
            tasks[shash].calls += (calls or {}).get((model, gv.name_hint), 1)
    return sorted(tasks.values(), key=lambda t: (-t.cost, t.key))


def _build(mod: tvm.IRModule, target: tvm.target.Target, _params: Any, *, ieee_arithmetic: bool = True,
           vector_math: bool = True) -> Any:
    """MetaSchedule's default build, without the tensor-intrinsic import on LLVM targets;
    ``IEEEArithmetic`` and ``VectorizeMath`` left out as ``CompileOptions`` may ask."""
    if target.kind.name != "llvm":
        importlib.import_module("tvm.s_tir.tensor_intrin")  # registers the GPU intrinsics
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    # as compile builds the chosen schedule
    mod = NaNExactComparisons(target)(mod)
    if ieee_arithmetic:
        mod = IEEEArithmetic(target)(mod)
    mod = WrappingIntegers(target)(mod)
    if vector_math:
        mod = VectorizeMath(target)(mod)
    if target.kind.name == "llvm":  # compile's TIR pipeline: a symbolic kernel's parallel loops guarded
        return tvm_build(mod, target=codegen_target(target), pipeline=tir_pipeline())
    return tvm_build(mod, target=target)


@contextlib.contextmanager
def cpu_intrinsics_only(target: tvm.target.Target) -> Iterator[None]:
    """On LLVM targets, let MetaSchedule's ``import tvm.s_tir.tensor_intrin`` load only the
    CPU intrinsics its rules name (x86 or Arm), not the CUDA ones (most of its time).

    A stand-in package with the real ``__path__`` sits in ``sys.modules`` while tuning and
    is removed afterwards, so a later import anywhere loads the real package in full.
    """
    name = "tvm.s_tir.tensor_intrin"
    if target.kind.name != "llvm" or name in sys.modules:
        yield
        return
    spec = importlib.util.find_spec(name)
    stub = types.ModuleType(name)
    stub.__path__ = list(spec.submodule_search_locations or [])
    stub.__package__ = name
    sys.modules[name] = stub
    try:
        arm = str(target.export().get("mtriple", "")).startswith(("aarch64", "arm"))
        importlib.import_module(f"{name}.{'arm_cpu' if arm else 'x86'}")
        yield
    finally:
        if sys.modules.get(name) is stub:
            del sys.modules[name]
            parent = sys.modules.get("tvm.s_tir")
            if getattr(parent, "tensor_intrin", None) is stub:
                delattr(parent, "tensor_intrin")


def build_function(options: CompileOptions | None = None) -> Callable[..., Any]:
    """The build of a candidate as ``compile`` builds under ``options`` (``_build``, with
    ``IEEEArithmetic`` or ``VectorizeMath`` left out where they are off)."""
    if options is None or (options.ieee_arithmetic and options.vector_math):
        return _build
    return functools.partial(_build, ieee_arithmetic=options.ieee_arithmetic, vector_math=options.vector_math)


def make_builder(timeout_s: float, workers: int, options: CompileOptions | None = None) -> ms.builder.LocalBuilder:
    """MetaSchedule's local builder, building each candidate as ``compile`` would under ``options``."""
    return ms.builder.LocalBuilder(max_workers=workers, timeout_sec=timeout_s, f_build=build_function(options))


def evaluator_config() -> ms.runner.EvaluatorConfig:
    """Ten single calls, each after flushing every argument but the first from the caches:
    in a model a kernel finds its input just written and its weights (far larger than the
    caches in all) evicted, so a schedule that only wins on hot weights does not count."""
    return ms.runner.EvaluatorConfig(number=1, repeat=10, min_repeat_ms=0, enable_cpu_cache_flush=True)


def fastest_repeat(rt_mod: Any, device: Any, config: Any, repeated_args: Any) -> list[float]:
    """MetaSchedule's local timing, reduced to the fastest repeat: on a shared machine a
    neighbour only ever adds time, so the fastest repeat is the closest to the kernel's own
    (under load, the mean of ten moves between runs of one kernel)."""
    from tvm.s_tir.meta_schedule.runner.local_runner import default_run_evaluator

    return [min(default_run_evaluator(rt_mod, device, config, repeated_args))]


def make_runner(timeout_s: float) -> ms.runner.LocalRunner:
    """MetaSchedule's local runner: one worker process, which it kills (and restarts for the
    next candidate) when a candidate crashes it or takes longer than ``timeout_s``."""
    return ms.runner.LocalRunner(timeout_sec=timeout_s, evaluator_config=evaluator_config(),
                                 f_run_evaluator=fastest_repeat)


class Tools:
    """The builder, runner and cost model of a run, each made on first use (the builder
    and runner start worker processes: a resumed run with nothing to do needs neither).

    With a ``tracker``, candidates are built here on all local cores and measured on the
    tracker's servers, ``workers`` at a time (``schedules.tuning.remote``).  ``options``
    are the run's ``CompileOptions``: the builds and the default schedules follow them."""

    def __init__(self, target: tvm.target.Target, builder_timeout: float, runner_timeout: float,
                 tracker: Tracker | None = None, workers: int = 1, options: CompileOptions | None = None) -> None:
        self.builder_timeout = builder_timeout
        self.runner_timeout = runner_timeout
        self.cores = max(1, int(target.export().get("num-cores", 1) or 1))
        self.tracker = tracker
        self.workers = workers
        self.options = options

    @functools.cached_property
    def builder(self) -> ms.builder.LocalBuilder:
        try:  # LocalBuilder checks its workers at once, under the same timeout
            return make_builder(self.builder_timeout, (os.cpu_count() or 1) if self.tracker else self.cores,
                                self.options)
        except Exception as err:
            raise TuningFailed(
                f"no candidate can be built: the build workers did not answer within "
                f"builder_timeout={self.builder_timeout} s ({type(err).__name__}: {err}); "
                "raise builder_timeout") from err

    @functools.cached_property
    def runner(self) -> ms.runner.Runner:
        if self.tracker is not None:
            return RemoteRunner(self.tracker, self.workers, evaluator_config())
        return make_runner(self.runner_timeout)

    @functools.cached_property
    def cost_model(self) -> Any:
        return ms.cost_model.CostModel.create("xgb", num_tuning_cores=self.cores)


def valid_records(db: Any, workload: tvm.IRModule) -> list[Any]:
    """The task's records that built and ran, fastest first."""
    if not db.has_workload(workload):
        return []
    records = db.get_top_k(db.commit_workload(workload), 1 << 30)
    return [r for r in records if r.run_secs and mean_secs(r.run_secs) < FAILED_SECS]


def mean_secs(secs: Any) -> float:
    values = [float(s.value if hasattr(s, "value") else s) for s in secs]
    return sum(values) / len(values)


def default_schedule(workload: tvm.IRModule, target: tvm.target.Target,
                     options: CompileOptions | None = None) -> Any:
    """The first default rule's schedule of the workload (the rules with the knobs of
    ``options``, as ``compile`` builds them), or None when no rule applies."""
    for rule in default_rules(target, options):
        try:
            sch = rule.apply(workload["main"], target, False)
        except Exception as err:  # noqa: BLE001 - a failing rule is skipped, as at compile time
            _LOG.warning("default rule %r failed on %s: %s", rule, workload["main"].attrs[SIGNATURE_ATTR], err)
            continue
        sch = (sch[0] if sch else None) if isinstance(sch, list) else sch
        if sch is not None:
            return sch
    return None


@derived_object
class _Watch(ms.measure_callback.PyMeasureCallback):
    """Counts measured candidates (for progress), keeps the first failure message, and
    ends the search after the batch that passes ``deadline`` (``time.monotonic()``)."""

    def __init__(self, on_batch: Callable[[int], None], deadline: float | None = None) -> None:
        self.on_batch = on_batch
        self.deadline = deadline
        self.ok = 0
        self.errors: list[str] = []
        self.stopped = False  # the deadline ended the search

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        for built, ran in zip(builder_results, runner_results):
            error = built.error_msg or ran.error_msg
            if error:
                self.errors.append(str(error))
            else:
                self.ok += 1
        self.on_batch(len(measure_candidates))
        if self.deadline is not None and not self.stopped and time.monotonic() > self.deadline:
            self.stopped = True  # the batch is in the database (the default callbacks ran first)
            task_scheduler.terminate_task(task_id)


def _warm_start(context: ms.TuneContext, db: Any, task: Task, cost_model: Any) -> None:
    """Train the cost model on the task's records measured outside this search (the seeds,
    the structural neighbours, an earlier run's candidates): the search's first picks then
    follow what is known near the default instead of an untrained model's guesses, and
    those records, the population's measured parents, are the ones it mutates most."""
    candidates, results = [], []
    for record in valid_records(db, task.workload):
        sch = s_tir.Schedule(task.workload)
        try:
            replay(record.trace, sch)
        except Exception:  # noqa: BLE001 - a record that no longer replays teaches nothing
            continue
        candidates.append(ms.MeasureCandidate(sch, record.args_info))
        results.append(ms.runner.RunnerResult(run_secs=list(record.run_secs), error_msg=None))
    if candidates:
        cost_model.update(context, candidates, results)


def search(task: Task, target: tvm.target.Target, db: Any, trials: int, tools: Tools, *, work_dir: str,
           on_batch: Callable[[int], None], seed: int = 0, spaces: list[s_tir.Schedule] | None = None,
           deadline: float | None = None) -> bool:
    """MetaSchedule's evolutionary search for ``trials`` more candidates of ``task``, in
    ``spaces`` (our rule's design spaces) when given, else in MetaSchedule's own space.
    Past ``deadline`` (``time.monotonic()``) it stops after the batch being measured.
    Returns whether the deadline stopped it."""
    watch = _Watch(on_batch, deadline)
    # MetaSchedule's population of 512 costs minutes per task on 2 cores; a few trials
    # cannot use more than a few dozen candidates.  Our spaces vary three block sizes per
    # structural choice, and each replay re-runs the rule's layout rewrites: a population
    # of 64 covers them, measured 8 at a time so that the cost model learns in between.
    population = 64 if spaces else min(512, max(64, 16 * trials))
    per_iter = min(trials, 8 if spaces else 16)
    strategy = ms.search_strategy.EvolutionarySearch(
        population_size=population, init_min_unmeasured=min(50, population // 2))
    context = ms.TuneContext(
        mod=task.workload, target=target,
        space_generator=space_generator(spaces) if spaces else "post-order-apply",
        search_strategy=strategy, task_name=task.key, rand_state=seed,
        num_threads=tools.cores,
    )
    _warm_start(context, db, task, tools.cost_model)
    try:
        ms.tune_tasks(
            tasks=[context], task_weights=[1.0], work_dir=work_dir, max_trials_global=trials,
            max_trials_per_task=trials, num_trials_per_iter=per_iter, builder=tools.builder,
            runner=tools.runner, database=db, cost_model=tools.cost_model,
            measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"), watch],
            task_scheduler="round-robin",
        )
    except (RuntimeError, ValueError) as err:  # ScheduleError and the FFI errors derive from them
        if watch.stopped and "is_terminated" in str(err):
            # the scheduler ended the task too (its trials or candidates spent in the same
            # batch) and checks that it was still running: the deadline's stop, nothing failed
            return True
        first = str(err).strip().splitlines()
        detail = next((line.strip() for line in first if "Error" in line), first[0] if first else "")
        raise SearchFailed(f"task {task.key}: MetaSchedule's search raised after {watch.ok} candidate(s) ran: "
                           f"{detail[:300]}") from err
    if watch.ok == 0 and watch.errors:
        first = watch.errors[0].strip().splitlines()
        detail = " | ".join(line.strip() for line in first[-3:])
        raise TuningFailed(
            f"task {task.key}: none of {len(watch.errors)} candidates built and ran ({detail}); "
            "if this is a builder timeout, raise builder_timeout"
        )
    return watch.stopped
