"""``aicf_tvm.tune``: tune the Emit kernels of one or more models into a work dir.

Every model is imported, optimized and lowered to Emit PrimFuncs exactly as ``compile``
does (before any default schedule), their kernels become one task per contract signature
across all models (``schedules.tune.extract_tasks``), costliest first, and each task is
seeded with its measured default schedule and searched by MetaSchedule.  The work dir
holds MetaSchedule's JSON database plus ``aicf_tuning.json`` (per signature: trials,
default and tuned seconds, the choice); ``compile(..., database=work_dir)`` applies it.
Running again with the same arguments skips tasks that already have their trials; a run
killed midway (even with ``kill -9``) leaves a database that loads and resumes.  A candidate
that crashes or hangs the runner costs at most ``runner_timeout`` seconds and is recorded
as failed; tuning goes on with the next one.
With ``rpc="HOST:PORT"`` and ``key``, candidates are built here and measured on every
server registered with that TVM RPC tracker under ``key`` (``schedules.remote``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tvm

from .errors import TuningError, UnsupportedModelError
from .report import FusionReport
from .targets import describe, resolve_target


@dataclass
class TuneResult:
    """The outcome of a tuning run: one entry per task, and where the records are."""

    work_dir: Path
    target: tvm.target.Target
    models: list[str]
    tasks: list[Any] = field(default_factory=list)  # schedules.tune.TaskOutcome
    measured: int = 0  # candidates measured by this run (the default baselines excluded)
    untuned: list[str] = field(default_factory=list)  # task keys left for lack of budget
    measured_on: str = "this machine"  # or "rpc HOST:PORT key KEY (N servers)"

    @property
    def tuned(self) -> list[Any]:
        """Tasks whose best tuned record beat the default schedule."""
        return [t for t in self.tasks if t.choice == "tuned"]

    def summary(self) -> str:
        head = (f"tuned {len(self.models)} model(s) for {describe(self.target)} into {self.work_dir}: "
                f"{len(self.tasks)} task(s), {self.measured} candidate(s) measured on {self.measured_on}")
        lines = [head]
        for t in self.tasks:
            note = " (resumed: already tuned)" if t.skipped else ""
            lines.append(f"  {t.key:40s} default {_ms(t.default_s):>12s}  tuned {_ms(t.tuned_s):>12s}"
                         f"  -> {t.choice}{note}")
        if self.untuned:
            lines.append(f"  {len(self.untuned)} task(s) not tuned: trial budget spent")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def _ms(secs: float | None) -> str:
    return "-" if secs is None else f"{secs * 1e3:.4f} ms"


def lower_for_tuning(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """normalize -> optimize -> LowerEmits (for ``target``): the Emit PrimFuncs before any
    schedule, as ``compile`` sees them."""
    from relax_passes import LowerEmits

    from .pipeline import normalize, optimize

    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise UnsupportedModelError("the module has no 'main' function")
    optimized = optimize(normalize(mod), FusionReport(), target=target)
    with target:
        return LowerEmits()(optimized)


def _model_name(spec: Any, index: int) -> str:
    return os.fspath(spec) if isinstance(spec, (str, os.PathLike)) else f"model{index}"


def _save_choices(work_dir: Path, target: tvm.target.Target, choices: dict) -> None:
    """Write ``aicf_tuning.json`` atomically (a kill leaves the old or the new file)."""
    from schedules.select import CHOICES_FILE

    path = work_dir / CHOICES_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"target": describe(target), "tasks": choices}, indent=1, sort_keys=True))
    os.replace(tmp, path)


def tune(models: Any, target: Any = "llvm", trials: int = 64, work_dir: Any = "aicf_tuning", *,
         trials_per_task: int | None = None, builder_timeout: float = 300, runner_timeout: float = 60,
         progress: bool = True, rpc: str | None = None, key: str | None = None,
         workers: int | None = None, threads: int | None = None) -> TuneResult:
    """Tune the Emit kernels of ``models`` (one or a list of what ``load_model`` takes).

    ``trials`` caps the candidates measured in this run; each task gets ``trials_per_task``
    (default: an even share of ``trials``).  A candidate still measuring after
    ``runner_timeout`` seconds (with ``rpc``: still in its session, upload and link
    included) is killed and recorded as failed.  With ``rpc="HOST:PORT"`` and ``key``,
    measure on that tracker's servers, ``workers`` sessions at once (default: one per
    server registered now); ``target`` must then describe the servers' device.  Raises
    ``TuningError`` for a corrupt database (left untouched), when no candidate of a task
    built, for a ``runner_timeout`` that is not a positive number, and when the tracker is
    unreachable or has no server under ``key``.  Candidates are measured with the threads
    the tuned model will run with (``threads``, else as ``compile`` chooses).
    """
    from .threads import thread_count

    _check_seconds("runner_timeout", runner_timeout)
    tgt = resolve_target(target)
    with _worker_threads(thread_count(threads, tgt.export())):
        return _tune(specs_or(models), tgt, trials, work_dir, trials_per_task, builder_timeout,
                     runner_timeout, progress, rpc, key, workers)


@contextlib.contextmanager
def _worker_threads(count: int):
    """MetaSchedule measures in worker processes, whose TVM pools read only the environment:
    they run with the threads the tuned model will run with, for this call only."""
    previous = os.environ.get("TVM_NUM_THREADS")
    os.environ["TVM_NUM_THREADS"] = str(count)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TVM_NUM_THREADS", None)
        else:
            os.environ["TVM_NUM_THREADS"] = previous


def specs_or(models: Any) -> list:
    """One model or a list of them, as a list."""
    return list(models) if isinstance(models, (list, tuple)) else [models]


def _tune(specs: list, tgt: Any, trials: int, work_dir: Any, trials_per_task: int | None,
          builder_timeout: float, runner_timeout: float, progress: bool, rpc: str | None,
          key: str | None, workers: int | None) -> TuneResult:
    from tqdm.auto import tqdm

    from schedules import tune as st
    from schedules.select import load_choices, open_database

    from .frontends import load_model

    tracker, workers, where = _remote(rpc, key, workers, runner_timeout)
    if not specs:
        raise TuningError("tune: no model given")
    names = [_model_name(s, i) for i, s in enumerate(specs)]
    lowered = [(name, lower_for_tuning(load_model(s), tgt)) for name, s in zip(names, specs)]
    tasks = st.extract_tasks(lowered, tgt)
    if not tasks:
        raise TuningError(f"tune: {', '.join(names)} has no Emit kernels to tune")

    wdir = Path(work_dir)
    db = open_database(wdir, create=True)  # validates the files before anything is written
    choices = load_choices(wdir)
    per_task = trials_per_task or max(1, trials // len(tasks))
    tools = st.Tools(tgt, builder_timeout, runner_timeout, tracker, workers)
    result = TuneResult(wdir, tgt, names, measured_on=where)
    bar = tqdm(total=min(trials, per_task * len(tasks)), unit="trial", disable=not progress, desc="tune")
    with st.cpu_intrinsics_only(tgt), contextlib.closing(bar):
        for index, task in enumerate(tasks):
            bar.set_description(f"tune {index + 1}/{len(tasks)} {task.kind}")
            try:
                out = _tune_task(task, index, db, tools, per_task, trials - result.measured, result, bar)
            except st.TuningFailed as err:
                model, kernel = task.uses[0]
                raise TuningError(f"tuning kernel {kernel} of {model} failed: {err}") from err
            if out is None:
                result.untuned.append(task.key)
                continue
            result.tasks.append(out)
            choices[task.key] = out.to_json() | {"uses": [list(u) for u in task.uses]}
            _save_choices(wdir, tgt, choices)
    return result


def _check_seconds(name: str, value: Any) -> None:
    """Raise ``TuningError`` unless ``value`` is a finite number of seconds > 0."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (is_number and math.isfinite(value) and value > 0):
        raise TuningError(f"tune: {name}={value!r}; give a number of seconds > 0")


def _remote(rpc: str | None, key: str | None, workers: int | None, timeout_s: float) -> tuple[Any, int, str]:
    """The tracker to measure on (None: this machine), its sessions limited to ``timeout_s``
    (whole seconds), the parallel sessions, and a label."""
    from schedules.remote import RemoteError, Tracker

    if rpc is None:
        if key is not None or workers is not None:
            raise TuningError("tune: key and workers need rpc='HOST:PORT' (a TVM RPC tracker)")
        return None, 1, "this machine"
    if workers is not None and workers < 1:
        raise TuningError(f"tune: workers={workers}; give at least 1")
    try:
        tracker = dataclasses.replace(Tracker.parse(rpc, key or ""), session_timeout_s=math.ceil(timeout_s))
        servers = tracker.servers()
    except RemoteError as err:
        raise TuningError(f"tune: {err}") from err
    if servers == 0:
        raise TuningError(f"tune: no RPC server is registered under key {key!r} with the tracker at {rpc}; "
                          f"start one with `python -m tvm.exec.rpc_server --tracker {rpc} --key {key}`")
    return tracker, workers or servers, f"rpc {rpc} key {key} ({servers} server(s))"


def _tune_task(task: Any, index: int, db: Any, tools: Any, per_task: int, left: int, result: TuneResult,
               bar: Any) -> Any:
    """Seed, search and judge one task; None when the run's trial budget is spent."""
    from schedules import tune as st

    baseline = st.seed_default(task, result.target, db, tools)
    done = len(st.tuned_records(db, task, baseline))
    budget = min(per_task - done, left)
    if budget <= 0 and done < per_task:
        return None

    def step(n: int) -> None:
        result.measured += n
        bar.update(n)

    if budget > 0:
        st.search(task, result.target, db, budget, tools, work_dir=str(result.work_dir), on_batch=step,
                  seed=index)
    return st.outcome(task, db, baseline, skipped=budget <= 0)
