"""Measuring a tuning task's kernels as ``compile`` runs them, and judging the outcome.

``seed_default`` measures the default rule's schedule and, when the rule has design
spaces (``tune_space``), the default plan's trace in them, and commits both as records:
the search then starts from the default as its best measured point and mutates around
it.  ``measure_spaces`` measures the other spaces' own traces (the default's structural
neighbours, with its block sizes) as the first candidates.  ``outcome`` measures the
default and the ``CONFIRM_TOP`` best tuned records again, in turns, and keeps a record
only when it is still faster than the default by ``WIN_MARGIN``: the best of many noisy
measurements is otherwise a lucky draw of an equal kernel.  It names that record
(``select.record_digest``), so ``compile`` applies exactly it.

Every kernel is timed in its ``tune_space.timed_form``, on prepacked weights.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import tvm
import tvm_ffi
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms

from .select import record_digest
from .tune import FAILED_SECS, Task, Tools, TuningFailed, _mean, default_schedule, valid_records
from .tune_space import has_unplain_rewrite, timed_form

_LOG = logging.getLogger(__name__)
WIN_MARGIN = 0.98  # a tuned record must beat the default by 2%: less is measurement noise
CONFIRM_TOP = 2  # the best tuned records measured again against the default
CONFIRM_ROUNDS = 3  # turns of that measurement (each kernel's fastest turn is kept)


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

    def to_json(self) -> dict:
        return {"kind": self.kind, "trials": self.trials, "default_s": self.default_s,
                "tuned_s": self.tuned_s, "choice": self.choice, "record": self.record}

    @classmethod
    def from_json(cls, key: str, entry: Mapping[str, Any], skipped: bool) -> "TaskOutcome":
        """An outcome saved by an earlier run (``aicf_tuning.json``)."""
        return cls(key, str(entry.get("kind", "")), int(entry.get("trials", 0)), entry.get("default_s"),
                   entry.get("tuned_s"), str(entry.get("choice", "default")), skipped, entry.get("record"))


def _replays(trace: Any, workload: tvm.IRModule, expected: tvm.IRModule) -> bool:
    """Whether ``trace`` rebuilds ``expected`` from ``workload`` (then it can be a record)."""
    try:
        sch = tvm.s_tir.Schedule(workload)
        trace.apply_to_schedule(sch, remove_postproc=False)
        return bool(tvm_ffi.structural_equal(sch.mod, expected))
    except Exception:  # noqa: BLE001
        return False


def measure(mods: list[tvm.IRModule], target: tvm.target.Target, builder: Any, runner: Any,
            rounds: int = 1) -> list[float | str]:
    """Seconds per call of each of ``mods`` on the tuning runner, or the error that stopped
    it: the fastest of ``rounds`` turns, each measuring every module once, in order (on a
    shared machine a neighbour only ever adds time, and it hurts all modules alike)."""
    built = builder.build([ms.builder.BuilderInput(mod, target) for mod in mods])
    device = "cuda" if "gpu" in target.keys else "cpu"
    out: list[float | str] = [str(b.error_msg) if b.error_msg else "" for b in built]
    runs: dict[int, list[float]] = {i: [] for i, b in enumerate(built) if not b.error_msg}
    try:
        for _ in range(rounds):
            live = [i for i in runs if not out[i]]
            inputs = [ms.runner.RunnerInput(built[i].artifact_path, device,
                                            ms.arg_info.ArgInfo.from_entry_func(mods[i], remove_preproc=True))
                      for i in live]
            for i, future in zip(live, runner.run(inputs) if inputs else []):
                result = future.result()
                if result.error_msg:
                    out[i] = str(result.error_msg)
                else:
                    runs[i].append(_mean(result.run_secs))
    finally:
        for b in built:
            if b.artifact_path:
                shutil.rmtree(os.path.dirname(b.artifact_path), ignore_errors=True)
    return [out[i] if out[i] or not runs.get(i) else min(runs[i]) for i in range(len(mods))]


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
    sch = default_schedule(task.workload, target)
    if sch is None:
        return Baseline(None, None)
    seeds = [sch, *spaces[:1]]
    texts = [str(s.trace) for s in seeds]
    known = {str(r.trace): _mean(r.run_secs) for r in valid_records(db, task.workload)}
    todo = [i for i, text in enumerate(texts) if text not in known]
    timed = measure([timed_form(seeds[i].mod) for i in todo], target, tools.builder, tools.runner) if todo else []
    for i, secs in zip(todo, timed):
        if isinstance(secs, str):
            _LOG.warning("seed %d of %s did not run: %s", i, task.key, secs.strip()[-300:])
            continue
        known[texts[i]] = secs
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
        run = [FAILED_SECS * 10] if isinstance(result, str) else [result]
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


def _replayed(trace: Any, workload: tvm.IRModule) -> tvm.IRModule:
    sch = s_tir.Schedule(workload)
    trace.apply_to_schedule(sch, remove_postproc=False)
    return sch.mod


def outcome(task: Task, target: tvm.target.Target, db: Any, baseline: Baseline, tools: Tools,
            skipped: bool = False) -> TaskOutcome:
    """Measure the default and the ``CONFIRM_TOP`` best tuned records again, in
    ``CONFIRM_ROUNDS`` turns; keep the fastest record if it beats the default by
    ``WIN_MARGIN`` (always when the default did not run), else the default."""
    tuned = tuned_records(db, task, baseline)
    result = TaskOutcome(task.key, task.kind, len(tuned), baseline.secs, None, "default", skipped)
    if not tuned:
        return result
    default = default_schedule(task.workload, target)
    best = tuned[:CONFIRM_TOP]
    mods = [timed_form(_replayed(r.trace, task.workload)) for r in best]
    if default is not None and baseline.secs is not None:
        mods.append(timed_form(default.mod))
    secs = measure(mods, target, tools.builder, tools.runner, rounds=CONFIRM_ROUNDS)
    default_s = secs.pop() if len(secs) > len(best) else None
    if isinstance(default_s, str):
        _LOG.warning("default schedule of %s did not run again: %s", task.key, default_s.strip()[-300:])
        default_s = None
    ran = [(s, r) for s, r in zip(secs, best) if not isinstance(s, str)]
    if not ran:
        return result
    tuned_s, record = min(ran, key=lambda x: x[0])
    default_s = baseline.secs if default_s is None else default_s
    wins = default_s is None or tuned_s < WIN_MARGIN * default_s
    return TaskOutcome(task.key, task.kind, len(tuned), default_s, tuned_s, "tuned" if wins else "default",
                       skipped, record_digest(record.trace) if wins else None)
