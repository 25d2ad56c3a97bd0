"""Choosing each tuned kernel by its time inside the models it serves.

Tuning times a candidate alone (``schedules.tuning.measure``): one kernel, caches flushed,
the fastest of its repeats.  In a model the kernel runs after its producer, on an input
that producer has just written, beside kernels that evict its weights.  The two orders
can disagree: a blocked-convolution plan of ResNet-50 that ranked near the default alone
ran far slower in the model, and a tuning run that kept the kernel-time winners left the
model no faster (docs/benchmarks-history.md, "Timings moved out of the source").  So
once every task is measured, ``choose`` times the candidates where they run:

1. The candidates of a task: the default rule, then its ``MODEL_CANDIDATES`` fastest
   records by kernel time among those whose kernel time is within ``PLAUSIBLE`` of the
   default's: a model build and its turns cost far more than a kernel measurement, and a
   record slower alone than that has not once won in a model (a task without such a
   record is not timed there).
2. Variant ``r`` is each model built with every task at its ``r``-th candidate (the
   default where a task has fewer), as ``compile(database=work_dir)`` builds it
   (``apply_database`` with those choices).
3. In each of ``MODEL_TURNS`` turns every variant runs once (in order, every other turn
   backwards) under a VM instrument that times each kernel call; a task's time in a turn
   is the sum over its calls in every model.
4. A task takes the candidate whose median turn is least if it beats the default by
   ``WIN_MARGIN`` turn by turn and median to median (``schedules.tuning.measure.win_ratio``).
5. The model with every task so chosen and the default are built again, each
   ``CONFIRM_BUILDS`` times, and timed in ``MODEL_TURNS`` fresh turns, each side's builds
   averaged; a task keeps its record only if it wins there again. The least of many
   medians is otherwise a lucky draw, of the turns or of the build: identical builds of
   one model in one process time its kernels further apart than VMs of one build (the
   weights and code shared) do. Two compiles export byte-identical libraries: it is where
   a loaded build lies, not what it is.
6. Those records stay only if the models' own calls (no instrument), summed over the
   models, are ``WIN_MARGIN`` faster with them in the same turns; else every task keeps
   its default rule. Records that won timed per kernel have left the model no faster in a
   fresh process: a tuned model must not be slower than the untuned one where it is
   measured.

Under a ``deadline`` (a tuning run's time budget), ranks are built only while the time
left holds the build, every variant's screening turns and the confirming builds and turns,
each estimated from the default variant's build and a call after its first: the fastest records by
kernel time are timed first, so a short budget times those. Without time for even one
rank, ``choose`` raises ``OutOfTime`` and the kernel times choose.

A model with symbolic input dims, a run measured over RPC and a GPU target are not timed
here: their tasks keep the choice their kernel times made.  The variants are built with the
run's ``CompileOptions``, as ``compile(..., options=...)`` builds the model.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax

import schedules.tuning.measure as sm
from aicf_tvm.core.errors import AicfError
from aicf_tvm.core.options import CompileOptions
from aicf_tvm.driver.compiled import compiled_model, specs_of
from aicf_tvm.driver.pipeline import build, schedule
from aicf_tvm.runtime.compiled import CompiledModel
from schedules.prepack_weights import PREPACKED_SUFFIX
from schedules.select import record_digest

_LOG = logging.getLogger(__name__)
MODEL_CANDIDATES = 7  # records per task timed in the models, fastest by kernel time first
# a record is timed in the models only when its kernel time is at most this times the default's
PLAUSIBLE = 1.10
MODEL_TURNS = 15  # turns of each stage, each running every variant once
CONFIRM_BUILDS = 2  # builds of the default and of the chosen records in the confirming turns


@dataclass(frozen=True)
class TimedModel:
    """One model to time the tasks in: its name (as the tasks' uses name it), its Emit
    kernels before any schedule (``tuning.lower_for_tuning``) and inputs to run it on."""

    name: str
    kernels: tvm.IRModule
    inputs: list[np.ndarray]


class OutOfTime(AicfError):
    """The time left before ``choose``'s deadline builds and times no candidate."""

    def __init__(self, left_s: float, build_s: float) -> None:
        super().__init__(f"the {max(left_s, 0):.0f} s left of the time budget would not build and time one "
                         f"record and the confirming builds (a build of the model(s) took {build_s:.0f} s)")
        self.left_s, self.build_s = left_s, build_s


def _now() -> float:
    return time.monotonic()


@dataclass(frozen=True)
class ModelChoice:
    """What the models chose for one task: its record (None: the default rule) and the
    task's seconds per inference there: the default's and the record's in the confirming
    turns, or, for a task whose records all lost the screen, the default's and the best
    record's there."""

    record: str | None
    default_s: float
    tuned_s: float
    candidates: int

    def to_json(self) -> dict:
        return {"default_s": self.default_s, "tuned_s": self.tuned_s, "candidates": self.candidates}


@dataclass(frozen=True)
class ModelTiming:
    """The outcome of ``choose``: per task key its choice, and each model's seconds per
    call with every task at the default and as chosen (the median of paired turns)."""

    choices: dict[str, ModelChoice]
    default_s: dict[str, float]
    chosen_s: dict[str, float]
    kept: bool = True  # whether the models' calls were faster with the records that won
    screened: int = 0  # records that won the screening turns
    ranks: tuple[int, int] | None = None  # (ranks timed, ranks offered) when a deadline left out some

    def summary(self) -> str:
        tuned = sum(c.record is not None for c in self.choices.values())
        head = f"timed in the model(s): {tuned} of {len(self.choices)} task(s) chose a record there"
        if self.ranks is not None:
            head += (f" (the time budget left room for each task's {self.ranks[0]} fastest record(s) of "
                     f"{self.ranks[1]})")
        if not self.screened:
            return f"{head}; no record beat the default rule's kernel in the screening turns"
        times = ", ".join(f"{name} {self.default_s[name] * 1e3:.2f} -> {self.chosen_s[name] * 1e3:.2f} ms"
                          for name in self.default_s)
        verdict = "" if self.kept else "; not 2% faster as a whole, so every task keeps its default rule"
        return f"{head}; a call took {times} with the {self.screened} record(s) that won the screen{verdict}"


def model_inputs(kernels: tvm.IRModule, seed: int = 0) -> list[np.ndarray] | None:
    """Arrays to run ``kernels["main"]`` on, or None when an input has a symbolic dim.
    Integer and boolean inputs (token ids, masks) are ones: a valid id and an open mask."""
    specs, _ = specs_of(kernels["main"])
    if any(not isinstance(d, int) for s in specs for d in s.shape):
        return None
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s.shape).astype(s.dtype) if s.dtype.startswith(("float", "bfloat"))
            else np.ones(s.shape, dtype=s.dtype) for s in specs]


def kernel_seconds(model: CompiledModel, inputs: Sequence[np.ndarray], owner: Mapping[str, str],
                   spent: dict[str, float]) -> None:
    """Run ``model`` once and add each call's seconds to ``spent`` under its task's key."""
    start = [0.0]

    def instrument(func: Any, symbol: str, before: bool, ret: Any, *args: Any) -> int:
        key = owner.get(symbol)
        if key is not None:
            if before:
                start[0] = time.perf_counter()
            else:
                spent[key] += time.perf_counter() - start[0]
        return 0

    vm = model.vm
    vm.set_instrument(instrument)
    try:
        model(*inputs)
    finally:
        vm.set_instrument(None)


class _Variants:
    """Model variants built with given per-task records, timed in turns."""

    def __init__(self, models: Sequence[TimedModel], owners: Mapping[str, Mapping[str, str]],
                 target: tvm.target.Target, work_dir: Any, saved: Mapping[str, dict], threads: int | None,
                 step: Callable[[], None], options: CompileOptions | None = None) -> None:
        self.models, self.owners, self.target = models, owners, target
        self.work_dir, self.saved, self.threads, self.step = work_dir, saved, threads, step
        self.options = options

    def build(self, records: Mapping[str, str | None]) -> list[CompiledModel]:
        """Every model with each task in ``records`` at that record (None: the default
        rule) and the other tasks as ``saved`` chose."""
        choices = dict(self.saved) | {key: {"choice": "default" if r is None else "tuned", "record": r}
                                      for key, r in records.items()}
        built = []
        for m in self.models:
            lowered = schedule(m.kernels, self.target, self.work_dir, choices=choices, options=self.options)
            built.append(compiled_model(build(lowered, self.target), self.target, m.kernels["main"],
                                       threads=self.threads, lowered=lowered))
            self.step()
        return built

    def warm_call(self, variant: list[CompiledModel]) -> float:
        """Seconds of a call of every model of ``variant`` after a first one (which loads
        the code and allocates the storage: several times a later call's time)."""
        for m, compiled in zip(self.models, variant):
            compiled(*m.inputs)
        begin = _now()
        for m, compiled in zip(self.models, variant):
            compiled(*m.inputs)
        return _now() - begin

    def time(self, variants: Sequence[list[CompiledModel]], turns: int
             ) -> tuple[list[dict[str, list[float]]], list[dict[str, list[float]]]]:
        """Per variant: each task's seconds per turn (its kernel calls in every model) and
        each model's seconds per uninstrumented call, the variants run in turns."""
        for variant in variants:  # a first call loads the code and allocates the storage
            for m, compiled in zip(self.models, variant):
                compiled(*m.inputs)
        per_task = [defaultdict(list) for _ in variants]
        per_model = [defaultdict(list) for _ in variants]
        for turn in range(turns):
            order = list(enumerate(variants))  # every other turn backwards: no variant always first
            for i, variant in (order if turn % 2 == 0 else order[::-1]):
                spent: dict[str, float] = defaultdict(float)
                for m, compiled in zip(self.models, variant):
                    kernel_seconds(compiled, m.inputs, self.owners[m.name], spent)
                    begin = time.perf_counter()
                    compiled(*m.inputs)
                    per_model[i][m.name].append(time.perf_counter() - begin)
                for key, secs in spent.items():
                    per_task[i][key].append(secs)
            self.step()
        return per_task, per_model


def _pooled(tables: Sequence[Mapping[str, list[float]]], side: int) -> dict[str, list[float]]:
    """Per key, each turn's mean over the variants ``side``, ``side + 2``, ... of ``tables``
    (the confirming builds alternate default and chosen)."""
    mine = tables[side::2]
    return {key: [statistics.fmean(turn) for turn in zip(*(t[key] for t in mine))]
            for key in mine[0] if all(key in t for t in mine)}


def _owners(models: Sequence[TimedModel], tasks: Sequence[Any], keys: set[str]) -> dict[str, dict[str, str]]:
    """Per model, the task key of each kernel in ``keys``, by the names the VM may call it:
    a schedule that packs a weight renames its kernel (``prepack_weights``)."""
    owners: dict[str, dict[str, str]] = {m.name: {} for m in models}
    for task in tasks:
        if task.key in keys:
            for model, kernel in task.uses:
                if model in owners:
                    owners[model][kernel] = owners[model][kernel + PREPACKED_SUFFIX] = task.key
    return owners


def weight_bytes(kernels: tvm.IRModule) -> int:
    """Bytes of the constants ``kernels["main"]`` holds (the weights every variant's build
    keeps a packed copy of)."""
    total = [0]

    def visit(expr: Any) -> None:
        if isinstance(expr, tvm.ir.expr.GenericConst) and isinstance(expr.ty, relax.TensorType):
            total[0] += int(np.prod([int(d) for d in expr.value.shape], dtype=np.int64)) * \
                np.dtype(str(expr.value.dtype)).itemsize

    relax.analysis.post_order_visit(kernels["main"], visit)
    return total[0]


def available_bytes() -> int:
    """Memory the system can give this process now (``MemAvailable``), else all of it."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def variants_that_fit(models: Sequence[TimedModel]) -> int:
    """How many builds of all ``models`` may be held at once: each keeps its packed
    weights (counted twice, for the activations and the code), in half of what is free."""
    per_variant = 2 * sum(weight_bytes(m.kernels) for m in models) + (64 << 20)
    return int(available_bytes() // 2 // per_variant)


def plausible(record: Any, baseline: sm.Baseline) -> bool:
    """Whether ``record``'s kernel time is within ``PLAUSIBLE`` of the default's (a
    default never measured admits every record)."""
    return baseline.secs is None or sm.mean_secs(record.run_secs) <= PLAUSIBLE * baseline.secs


def candidates(db: Any, task: Any, baseline: sm.Baseline) -> list[str]:
    """Digests of the task's records to time in the models: the ``MODEL_CANDIDATES``
    fastest by kernel time of those ``plausible`` allows, the seeded default's excluded."""
    records = [r for r in sm.tuned_records(db, task, baseline) if plausible(r, baseline)]
    return [record_digest(r.trace) for r in records[:MODEL_CANDIDATES]]


def rounds(offered: Mapping[str, list[str]]) -> int:
    """The variants ``choose`` builds for these candidates: the default's, one per rank."""
    return 1 + max((len(c) for c in offered.values()), default=0)


def choose(models: Sequence[TimedModel], tasks: Sequence[Any], offered: Mapping[str, list[str]],
           target: tvm.target.Target, work_dir: Any, saved: Mapping[str, dict], threads: int | None,
           step: Callable[[], None] = lambda: None, options: CompileOptions | None = None,
           deadline: float | None = None) -> ModelTiming:
    """Time each task's ``offered`` records (and the default rule) in ``models`` and choose
    by those times (module docstring); ``saved`` holds the other tasks' choices, ``options``
    the ``CompileOptions`` the models are built with.  With a ``deadline`` (``_now()``
    seconds) only the ranks whose timing fits before it are built; ``OutOfTime`` when none."""
    keys = {k for k, c in offered.items() if c}
    owners = _owners(models, tasks, keys)
    variants = _Variants(models, owners, target, work_dir, saved, threads, step, options)
    ranks = rounds(offered)  # a task with no record adds no rank

    def rank(r: int) -> dict[str, str | None]:
        return {k: (offered[k][r - 1] if 0 < r <= len(offered[k]) else None) for k in keys}

    begin = _now()
    built = [variants.build(rank(0))]
    build_s = _now() - begin
    turn_s = 2 * MODEL_TURNS * variants.warm_call(built[0])  # a variant's turns: instrumented and plain calls
    for r in range(1, ranks):
        confirming = 2 * CONFIRM_BUILDS * (build_s + turn_s)
        if deadline is not None and _now() + build_s + (len(built) + 1) * turn_s + confirming > deadline:
            break
        built.append(variants.build(rank(r)))
    if len(built) < min(2, ranks):  # only under a deadline
        raise OutOfTime(deadline - _now(), build_s)
    cut = (len(built) - 1, ranks - 1) if len(built) < ranks else None
    offered = {k: c[:len(built) - 1] for k, c in offered.items()}
    screen, _ = variants.time(built, MODEL_TURNS)
    del built  # the confirming pair is built anew
    default = screen[0]
    picked: dict[str, str] = {}
    screened: dict[str, tuple[float, float]] = {}  # the default's and the best candidate's median there
    for key in keys:
        if not default.get(key):
            _LOG.warning("task %s ran no kernel in the timed models: its choice stays", key)
            continue
        ranked = [(statistics.median(screen[r][key]), r) for r in range(1, len(offered[key]) + 1) if screen[r].get(key)]
        if not ranked:
            continue
        best = min(ranked)[1]
        screened[key] = (statistics.median(default[key]), statistics.median(screen[best][key]))
        if sm.win_ratio(screen[best][key], default[key]) < sm.WIN_MARGIN:
            picked[key] = offered[key][best - 1]
    # built afresh, each side CONFIRM_BUILDS times and averaged: where a build's weights lie
    # moves its kernels by up to a third (module docstring), a win of one build carries over to no other
    pair = [dict.fromkeys(keys), {k: picked.get(k) for k in keys}]
    confirm, calls = variants.time([variants.build(pair[i % 2]) for i in range(2 * CONFIRM_BUILDS)], MODEL_TURNS)
    default_runs, chosen_runs = (_pooled(confirm, side) for side in (0, 1))
    default_calls, chosen_calls = (_pooled(calls, side) for side in (0, 1))
    out = {}
    for key in keys:
        if not default_runs.get(key) or key not in screened:
            continue
        record = picked.get(key)
        if record is None:  # lost the screen: its times there
            out[key] = ModelChoice(None, *screened[key], len(offered[key]))
            continue
        if sm.win_ratio(chosen_runs[key], default_runs[key]) >= sm.WIN_MARGIN:
            record = None  # the screen's win did not hold
        out[key] = ModelChoice(record, statistics.median(default_runs[key]), statistics.median(chosen_runs[key]),
                               len(offered[key]))
    ratios = {m.name: statistics.median(c / d for c, d in zip(chosen_calls[m.name], default_calls[m.name]))
              for m in models}
    base = {m.name: statistics.median(default_calls[m.name]) for m in models}
    whole = [[sum(runs[m.name][t] for m in models) for t in range(MODEL_TURNS)]
             for runs in (default_calls, chosen_calls)]
    kept = not any(c.record for c in out.values()) or sm.win_ratio(whole[1], whole[0]) < sm.WIN_MARGIN
    if not kept:  # the models, called as a user calls them, were not faster: every task keeps its default
        out = {k: dataclasses.replace(c, record=None) for k, c in out.items()}
    return ModelTiming(out, base, {name: base[name] * ratios[name] for name in base}, kept, len(picked), cut)
