"""Measuring a tuning task's kernels as ``compile`` runs them, and judging the outcome.

``seed_default`` measures the default rule's schedule and, when the rule has design
spaces (``tune_space``), the default plan's trace in them, and commits both as records:
the search then starts from the default as its best measured point and mutates around
it.  ``measure_spaces`` measures the other spaces' own traces (the default's structural
neighbours, with its block sizes) as the first candidates.  ``outcome`` measures the
default and the ``CONFIRM_TOP`` best tuned records again, in turns, and keeps a record
only when, turn by turn and median to median, it is still faster than the default by
``WIN_MARGIN``: the best of many noisy measurements is otherwise a lucky draw of an equal
kernel.  It names that record (``select.record_digest``), so ``compile`` applies exactly it.

Every kernel is timed in its ``schedules.tuning.space.timed_form``, on prepacked weights, by the
fastest of its repeats (``tune.fastest_repeat``).
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import tvm
import tvm_ffi
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms

from schedules.select import record_digest, replay
from schedules.tuning.space import has_unplain_rewrite, timed_form
from schedules.tuning.tasks import (
    FAILED_SECS,
    Task,
    Tools,
    TuningFailed,
    default_schedule,
    mean_secs,
    valid_records,
)

_LOG = logging.getLogger(__name__)
WIN_MARGIN = 0.98  # a tuned record must beat the default by 2%: less is measurement noise
CONFIRM_TOP = 2  # the best tuned records measured again against the default
CONFIRM_ROUNDS = 5  # turns of that measurement, each timing every kernel once


@dataclass
class TaskOutcome:
    """What tuning one task found: seconds per call of the default and of the best record."""

    key: str
    kind: str
    trials: int
    default_s: float | None
    tuned_s: float | None
    choice: str  # "tuned" or "default"
    skipped: bool = False
    record: str | None = None  # record_digest of the chosen record's trace
    # a kernel with symbolic extents (``tune_symbolic``): the bindings timed ("rows=16"),
    # and the chosen rule choice ({"rule": ..., "choice": {...}}) instead of a record
    bindings: list[str] | None = None
    plan: dict | None = None
    # the choice made by the kernel's time in the models (``aicf_tvm.driver.tuning.in_models``):
    # {"default_s", "tuned_s": seconds per inference, "candidates": how many were timed}
    in_model: dict | None = None

    def to_json(self) -> dict:
        out = {"kind": self.kind, "trials": self.trials, "default_s": self.default_s,
               "tuned_s": self.tuned_s, "choice": self.choice, "record": self.record}
        if self.bindings is not None:
            out |= {"bindings": self.bindings, "plan": self.plan}
        if self.in_model is not None:
            out["in_model"] = self.in_model
        return out

    @classmethod
    def from_json(cls, key: str, entry: Mapping[str, Any], skipped: bool) -> TaskOutcome:
        """An outcome saved by an earlier run (``aicf_tuning.json``)."""
        return cls(key, str(entry.get("kind", "")), int(entry.get("trials", 0)), entry.get("default_s"),
                   entry.get("tuned_s"), str(entry.get("choice", "default")), skipped, entry.get("record"),
                   entry.get("bindings"), entry.get("plan"), entry.get("in_model"))


def _replays(trace: Any, workload: tvm.IRModule, expected: tvm.IRModule) -> bool:
    """Whether ``trace`` rebuilds ``expected`` from ``workload`` (then it can be a record)."""
    try:
        sch = tvm.s_tir.Schedule(workload)
        replay(trace, sch)
        return bool(tvm_ffi.structural_equal(sch.mod, expected))
    except Exception:  # noqa: BLE001
        return False


def measure(mods: list[tvm.IRModule], target: tvm.target.Target, builder: Any, runner: Any,
            rounds: int = 1) -> list[list[float] | str]:
    """Seconds per call of each of ``mods`` on the tuning runner in each of ``rounds`` turns
    (a turn measures every module once, in order, so that the n-th values of two modules
    were taken close in time), or the error that stopped a module."""
    built = builder.build([ms.builder.BuilderInput(mod, target) for mod in mods])
    device = "cuda" if "gpu" in target.keys else "cpu"
    out: list[list[float] | str] = [str(b.error_msg) if b.error_msg else [] for b in built]
    try:
        for _ in range(rounds):
            live = [i for i, o in enumerate(out) if not isinstance(o, str)]
            inputs = [ms.runner.RunnerInput(built[i].artifact_path, device,
                                            ms.arg_info.ArgInfo.from_entry_func(mods[i], remove_preproc=True))
                      for i in live]
            for i, future in zip(live, runner.run(inputs) if inputs else []):
                result = future.result()
                if result.error_msg:
                    out[i] = str(result.error_msg)
                else:
                    out[i].append(mean_secs(result.run_secs))
    finally:
        for b in built:
            if b.artifact_path:
                shutil.rmtree(os.path.dirname(b.artifact_path), ignore_errors=True)
    return out


@dataclass(frozen=True)
class Baseline:
    """The default schedule of a task: its trace (as text), measured seconds per call, and
    the traces seeded for it (the default's, the default plan's in the design spaces)."""

    trace: str | None
    secs: float | None
    seeds: tuple[str, ...] = ()


def seed_default(task: Task, target: tvm.target.Target, db: Any, tools: Tools,
                 spaces: list[s_tir.Schedule] | None = None) -> Baseline:
    """Measure the default schedule and the first design space (the default plan's trace,
    when the rule has spaces) and commit each as a record, once: a resumed run finds them.

    Both are timed as ``compile`` runs them, on prepacked weights (``timed_form``); a
    default whose packing MetaSchedule could not take out is not committed (its search
    would fail on it), and is measured again by a resumed run.
    """
    sch = default_schedule(task.workload, target, tools.options)
    if sch is None:
        return Baseline(None, None)
    seeds = [sch, *(spaces or [])[:1]]
    texts = [str(s.trace) for s in seeds]
    known = {str(r.trace): mean_secs(r.run_secs) for r in valid_records(db, task.workload)}
    todo = [i for i, text in enumerate(texts) if text not in known and text not in texts[:i]]
    timed = measure([timed_form(seeds[i].mod) for i in todo], target, tools.builder, tools.runner) if todo else []
    for i, runs in zip(todo, timed):
        if isinstance(runs, str):
            _LOG.warning("seed %d of %s did not run: %s", i, task.key, runs.strip()[-300:])
            continue
        secs = known[texts[i]] = runs[0]
        if _replays(seeds[i].trace, task.workload, seeds[i].mod) and not has_unplain_rewrite(seeds[i].mod):
            args = ms.arg_info.ArgInfo.from_entry_func(seeds[i].mod, remove_preproc=True)
            db.commit_tuning_record(ms.database.TuningRecord(
                seeds[i].trace, db.commit_workload(task.workload), [secs], target, args))
    return Baseline(texts[0], known.get(texts[0]), tuple(texts))


def measure_spaces(task: Task, target: tvm.target.Target, db: Any, tools: Tools,
                   spaces: list[s_tir.Schedule], limit: int) -> int:
    """Measure and commit the traces of the design spaces after the first (each structural
    neighbour of the default plan, nearest first, with the plan's block sizes) that the
    database lacks, at most ``limit``: the first candidates are our rule's choices varied
    one at a time.  Returns how many were measured; raises ``TuningFailed`` when none ran."""
    token = db.commit_workload(task.workload)
    known = {str(r.trace) for r in db.get_top_k(token, 1 << 30)}
    todo = [s for s in spaces[1:] if str(s.trace) not in known][:max(0, limit)]
    if not todo:
        return 0
    secs = measure([timed_form(s.mod) for s in todo], target, tools.builder, tools.runner)
    for space, result in zip(todo, secs):
        args = ms.arg_info.ArgInfo.from_entry_func(space.mod, remove_preproc=True)
        run = [FAILED_SECS * 10] if isinstance(result, str) else result
        db.commit_tuning_record(ms.database.TuningRecord(space.trace, token, run, target, args))
    errors = [r for r in secs if isinstance(r, str)]
    if len(errors) == len(secs):
        detail = " | ".join(line.strip() for line in errors[0].strip().splitlines()[-3:])
        raise TuningFailed(f"task {task.key}: none of {len(errors)} candidates built and ran ({detail}); "
                           "if this is a builder timeout, raise builder_timeout")
    return len(todo)


def tuned_records(db: Any, task: Task, baseline: Baseline) -> list[Any]:
    """The task's valid records other than the seeded ones, fastest first."""
    seeds = set(baseline.seeds) | {baseline.trace}
    return [r for r in valid_records(db, task.workload) if str(r.trace) not in seeds]


def win_ratio(tuned_runs: list[float], default_runs: list[float]) -> float:
    """A tuned record's time over the default's: the median of the paired turns' ratios,
    or the ratio of the two medians where that is higher: a record must win by both.  The
    paired median alone once chose a ResNet-50 record whose median turn was slower than the
    default's (a few turns a neighbour slowed sway the pairs one way, the medians the other)."""
    paired = statistics.median(t / d for t, d in zip(tuned_runs, default_runs))
    return max(paired, statistics.median(tuned_runs) / statistics.median(default_runs))


def _replayed(trace: Any, workload: tvm.IRModule) -> tvm.IRModule | None:
    """The kernel ``trace`` builds from ``workload``; None if it no longer replays."""
    sch = s_tir.Schedule(workload)
    try:
        replay(trace, sch)
    except Exception:  # noqa: BLE001 - such a record cannot be chosen: compile could not use it
        return None
    return sch.mod


def outcome(task: Task, target: tvm.target.Target, db: Any, baseline: Baseline, tools: Tools,
            skipped: bool = False) -> TaskOutcome:
    """Measure the ``CONFIRM_TOP`` best tuned records and the default again, in
    ``CONFIRM_ROUNDS`` turns, and keep the record whose time over the default's (``win_ratio``:
    turn by turn and median to median) is lowest, if that is under ``WIN_MARGIN`` (any
    record that runs when the default did not); else the default.  Paired turns cancel what a shared machine adds
    to both alike; the times reported are each kernel's median turn."""
    tuned = tuned_records(db, task, baseline)
    result = TaskOutcome(task.key, task.kind, len(tuned), baseline.secs, None, "default", skipped)
    default = default_schedule(task.workload, target, tools.options)
    best, mods = [], []
    for record in tuned:
        if len(best) == CONFIRM_TOP:
            break
        mod = _replayed(record.trace, task.workload)
        if mod is not None:
            best.append(record)
            mods.append(timed_form(mod))
    if not best:
        return result
    if default is not None and baseline.secs is not None:
        mods.append(timed_form(default.mod))
    runs = measure(mods, target, tools.builder, tools.runner, rounds=CONFIRM_ROUNDS)
    default_runs = runs.pop() if len(runs) > len(best) else None
    if isinstance(default_runs, str):
        _LOG.warning("default schedule of %s did not run again: %s", task.key, default_runs.strip()[-300:])
    ran = [(r, record) for r, record in zip(runs, best) if not isinstance(r, str)]
    if not ran:
        return result
    if not isinstance(default_runs, list):  # the default does not run: any tuned record wins
        tuned_runs, record = min(ran, key=lambda x: statistics.median(x[0]))
        return TaskOutcome(task.key, task.kind, len(tuned), baseline.secs, statistics.median(tuned_runs),
                           "tuned", skipped, record_digest(record.trace))
    ratio, index = min((win_ratio(r, default_runs), i) for i, (r, _) in enumerate(ran))
    tuned_runs, record = ran[index]
    wins = ratio < WIN_MARGIN
    return TaskOutcome(task.key, task.kind, len(tuned), statistics.median(default_runs),
                       statistics.median(tuned_runs), "tuned" if wins else "default", skipped,
                       record_digest(record.trace) if wins else None)
