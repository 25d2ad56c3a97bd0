"""``aicf_tvm.tune``: tune the Emit kernels of one or more models into a work dir.

Every model is imported, optimized and lowered to Emit PrimFuncs exactly as ``compile``
does (before any default schedule, constant weights marked layout-free), their kernels
become one task per contract signature across all models (``schedules.tuning.tasks.extract_tasks``),
costliest first, and each task is seeded with its measured default schedule and searched
by MetaSchedule, in our default rule's design spaces where it has them
(``schedules.tuning.space``).  The trials go to the tasks in proportion to their cost
(FLOPs times calls per inference); a task whose share is under ``MIN_TRIALS`` gets none
and keeps its default rule, and one whose rule offers a known number of complete
schedules (a blocked convolution's plans) gets at most that many, the rest going on to
the others.  A kernel with symbolic extents is tuned in its rule's
choices, each timed at representative bindings of the model's dims
(``schedules.tuning.symbolic``); one whose rule has none keeps its default schedule.  The
work dir holds MetaSchedule's JSON database plus
``aicf_tuning.json`` (per signature: trials, default and tuned seconds as measured again
side by side, the choice and its record); ``compile(..., database=work_dir)`` applies it.
Last, each task's best records are timed again inside the models and the choice is made
by those times (``in_models``), which ``aicf_tuning.json`` keeps too (``in_model``).
Running again with the same arguments skips tasks that already have their trials; a run
killed midway (even with ``kill -9``) leaves a database that loads and resumes.  A candidate
that crashes or hangs the runner costs at most ``runner_timeout`` seconds and is recorded
as failed; tuning goes on with the next one.
With ``rpc="HOST:PORT"`` and ``key``, candidates are built here and measured on every
server registered with that TVM RPC tracker under ``key`` (``schedules.tuning.remote``).

``options`` (``CompileOptions``) are those of the compile the records are for: the models
are lowered with them, the default schedules, design spaces and rule choices come from
``default_rules(target, options)``, candidates are built as ``compile`` builds them under
those options, and the records are keyed by the knobs that differ from the defaults
(``schedules.select.option_knobs``), so ``compile(..., options=<the same>, database=work_dir)``
applies them and a compile under other knobs does not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tvm
from tqdm.auto import tqdm

import aicf_tvm.driver.tuning.in_models as tm
import schedules.tuning.measure as sm
import schedules.tuning.tasks as st
from aicf_tvm.core.errors import TuningError
from aicf_tvm.core.options import CompileOptions, options_or_default
from aicf_tvm.driver.frontends import load_model
from aicf_tvm.driver.pipeline import run_pipeline
from aicf_tvm.runtime.targets import describe, resolve_target
from aicf_tvm.runtime.threads import thread_count
from relax_passes.bound_shapes import bounds_of
from relax_passes.lower_emits import kernel_calls
from schedules.prepack_weights import mark_layout_free
from schedules.select import CHOICES_FILE, load_choices, open_database, option_knobs
from schedules.tuning.remote import RemoteError, Tracker
from schedules.tuning.space import design_spaces, space_count
from schedules.tuning.symbolic import choice_label, kernel_bindings, task_choices, tune_choices

_LOG = logging.getLogger(__name__)
# share of a time budget kept for timing the records in the models: the search stops at
# the rest, so a run under a budget still chooses by the models' times (``in_models``)
IN_MODEL_SHARE = 1 / 3


@dataclass
class TuneResult:
    """The outcome of a tuning run: one entry per task, and where the records are."""

    work_dir: Path
    target: tvm.target.Target
    models: list[str]
    tasks: list[Any] = field(default_factory=list)  # schedules.tuning.tasks.TaskOutcome
    measured: int = 0  # candidates measured by this run (the default baselines excluded)
    untuned: list[str] = field(default_factory=list)  # task keys left for lack of budget
    # "kernel of model: message" for a task whose MetaSchedule search raised (it keeps what was measured)
    search_failed: list[str] = field(default_factory=list)
    # "model: kernel (dims)" not tuned: symbolic extents, and a rule without tunable choices
    symbolic: list[str] = field(default_factory=list)
    measured_on: str = "this machine"  # or "rpc HOST:PORT key KEY (N servers)"
    in_model: str | None = None  # what timing the candidates in the models found (``in_models``)
    # per task key: why its records were not timed in the models (none within in_models.PLAUSIBLE)
    not_timed: dict[str, str] = field(default_factory=dict)
    time_budget: float | None = None  # seconds the run could take (None: no limit)
    search_budget: float | None = None  # of those, the search's (the rest times records in the models)
    over_budget: list[str] = field(default_factory=list)  # task keys left when the time budget was spent
    cut_short: list[str] = field(default_factory=list)  # task keys whose search the time budget ended

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
                         f"  -> {t.choice}{_by_how_much(t)}{note}")
            if t.bindings is not None:  # symbolic extents: times are geometric means over the bindings
                chosen = f": {choice_label(t.plan)}" if t.plan else ""
                lines.append(f"    symbolic, timed at {' | '.join(t.bindings)}{chosen}")
            if t.in_model is not None:
                lines.append(f"    in the model: default {_ms(t.in_model['default_s'])}, best record "
                             f"{_ms(t.in_model['tuned_s'])} per inference, {t.in_model['candidates']} "
                             "record(s) timed there")
            if t.key in self.not_timed:
                lines.append(f"    not timed in the model: {self.not_timed[t.key]}")
        if self.in_model:
            lines.append(f"  {self.in_model}")
        if self.untuned:
            lines.append(f"  {len(self.untuned)} task(s) not tuned: no trials left for them")
        if self.over_budget:
            lines.append(f"  {len(self.over_budget)} task(s) not tuned: {self._search_share()} was spent (a later "
                         "run with the same work dir continues)")
        if self.cut_short:
            lines.append(f"  search ended early: {self._search_share()} was spent; judged on what it "
                         f"measured: {', '.join(self.cut_short)}")
        for failure in self.search_failed:
            lines.append(f"  search failed, kept what was measured before (the default at least): {failure}")
        if self.symbolic:
            lines.append(f"  {len(self.symbolic)} kernel(s) with symbolic extents and no tunable choices "
                         "keep their default schedule: "
                         + ", ".join(self.symbolic))
        return "\n".join(lines)

    def _search_share(self) -> str:
        if self.search_budget is None or self.search_budget == self.time_budget:
            return f"the time budget ({self.time_budget:g} s)"
        return f"the search's {self.search_budget:g} s of the time budget ({self.time_budget:g} s)"

    def __str__(self) -> str:
        return self.summary()


def _by_how_much(t: Any) -> str:
    """The time ratio behind a task's verdict: the chosen record's over the default's, or,
    where the default stays, its best record's; measured in the models where the models
    chose (``in_model``), else by the kernel alone."""
    timed = t.in_model or {}
    default_s, tuned_s, where = timed.get("default_s"), timed.get("tuned_s"), "in the model"
    if not (default_s and tuned_s):
        default_s, tuned_s, where = t.default_s, t.tuned_s, "alone"
    if not (default_s and tuned_s):
        return ""
    ratio = tuned_s / default_s
    if t.choice == "tuned":
        return f" ({ratio:.2f}x the default's time {where})"
    return f" (best record {ratio:.2f}x the default's time {where})"


def _ms(secs: float | None) -> str:
    return "-" if secs is None else f"{secs * 1e3:.4f} ms"


def lower_for_tuning(mod: tvm.IRModule, target: tvm.target.Target,
                     options: CompileOptions | None = None) -> tvm.IRModule:
    """The Emit PrimFuncs before any schedule, constant weights marked layout-free:
    ``compile``'s pipeline under ``options``, stopped there (``compile`` marks them before
    it looks up a record, so the workloads are keyed alike)."""
    return mark_layout_free(run_pipeline(mod, target, until="kernels", options=options).kernels)


MIN_TRIALS = 4  # fewer trials than this do not pay for a task's search and re-measurement


def trial_shares(trials: int, costs: Sequence[float], caps: Sequence[int | None] | None = None) -> list[int]:
    """``trials`` split in proportion to ``costs``: while a share would be under
    ``MIN_TRIALS`` (or all of ``trials``, when fewer), the cheapest task gets none and its
    share goes to the others; the rounding leftovers go to the largest remainders.  Tasks
    of unknown cost (0) share evenly when all are.  A task with a cap (the candidates it
    has, when its design spaces can be measured one by one: ``schedules.tuning.space.space_count``)
    gets at most that, and what it cannot use goes to the others the same way."""
    caps = list(caps) if caps is not None else [None] * len(costs)
    shares = [0] * len(costs)
    known = any(c > 0 for c in costs)  # then a task of unknown cost gets none
    active = [i for i, c in enumerate(costs) if c > 0 or not known]
    while active and trials > 0:
        split = _shares_by_cost(trials, [costs[i] for i in active])
        full = [i for i, share in zip(active, split) if caps[i] is not None and share > caps[i]]
        if not full:
            for i, share in zip(active, split):
                shares[i] = share
            break
        for i in full:
            shares[i] = caps[i]
            trials -= caps[i]
            active.remove(i)
    return shares


def _shares_by_cost(trials: int, costs: Sequence[float]) -> list[int]:
    weights = list(costs) if any(c > 0 for c in costs) else [1.0] * len(costs)
    active = sorted((i for i, w in enumerate(weights) if w > 0), key=lambda i: (-weights[i], i))
    while True:
        total = sum(weights[i] for i in active)
        exact = {i: trials * weights[i] / total for i in active}
        if len(active) == 1 or exact[active[-1]] >= min(MIN_TRIALS, trials):
            break
        active.pop()
    shares = {i: int(exact[i]) for i in active}
    by_remainder = sorted(active, key=lambda i: (shares[i] - exact[i], i))
    for i in by_remainder[: trials - sum(shares.values())]:
        shares[i] += 1
    return [shares.get(i, 0) for i in range(len(weights))]


def _model_name(spec: Any, index: int) -> str:
    return os.fspath(spec) if isinstance(spec, (str, os.PathLike)) else f"model{index}"


def _save_choices(work_dir: Path, target: tvm.target.Target, choices: dict) -> None:
    """Write ``aicf_tuning.json`` atomically (a kill leaves the old or the new file)."""
    path = work_dir / CHOICES_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"target": describe(target), "tasks": choices}, indent=1, sort_keys=True))
    os.replace(tmp, path)


def tune(models: Any, target: Any = None, trials: int = 64, work_dir: Any = "aicf_tuning", *,
         trials_per_task: int | None = None, builder_timeout: float = 300, runner_timeout: float = 60,
         progress: bool = True, rpc: str | None = None, key: str | None = None,
         workers: int | None = None, threads: int | None = None,
         shapes: Any = None, bounds: Any = None, time_in_model: bool = True,
         options: CompileOptions | None = None, time_budget: float | None = None) -> TuneResult:
    """Tune the Emit kernels of ``models`` (one or a list of what ``load_model`` takes, with
    its ``shapes`` and ``bounds``).

    ``trials`` caps the candidates measured in this run; each task gets ``trials_per_task``
    (default: its share of ``trials`` by cost, ``trial_shares``).  A candidate still measuring after
    ``runner_timeout`` seconds (with ``rpc``: still in its session, upload and link
    included) is killed and recorded as failed.  With ``rpc="HOST:PORT"`` and ``key``,
    measure on that tracker's servers, ``workers`` sessions at once (default: one per
    server registered now); ``target`` must then describe the servers' device.  Raises
    ``TuningError`` for a corrupt database (left untouched), when no candidate of a task
    built, for a ``runner_timeout`` that is not a positive number, and when the tracker is
    unreachable or has no server under ``key``.  Candidates are measured with the threads
    the tuned model will run with (``threads``, else as ``compile`` chooses).  Then, with
    ``time_in_model`` (on a CPU target measured here), each task's best candidates are
    timed again inside the models and chosen by those times (``in_models``).

    ``time_budget`` (seconds; None: no limit) bounds the run: the search stops at
    ``1 - IN_MODEL_SHARE`` of it (no further task starts; the running one ends after its
    batch), the tasks left are listed, and a later run with the same work dir continues
    with them; the timing in the models takes the rest, as many records as fit.

    ``options`` are the ``CompileOptions`` of the compile to tune for (module docstring):
    compile with the same ones to apply the records.  As in ``compile``, ``target``
    (default ``"llvm"``) and ``threads`` given replace its own; its database is not read
    (``work_dir`` is the database).
    """
    _check_seconds("runner_timeout", runner_timeout)
    if time_budget is not None:
        _check_seconds("time_budget", time_budget)
    options = options_or_default(options).updated(target=target, threads=threads)
    tgt = resolve_target("llvm" if options.target is None else options.target)
    options = options.updated(target=tgt)
    with _worker_threads(thread_count(options.threads, tgt.export())):
        return _tune(specs_or(models), tgt, trials, work_dir, trials_per_task, builder_timeout,
                     runner_timeout, progress, rpc, key, workers, {"shapes": shapes, "bounds": bounds},
                     time_in_model and rpc is None and "cpu" in tgt.keys, options.threads, options,
                     time_budget=time_budget)


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
          key: str | None, workers: int | None, load_args: dict, time_in_model: bool = False,
          threads: int | None = None, options: CompileOptions | None = None,
          time_budget: float | None = None) -> TuneResult:
    tracker, workers, where = _remote(rpc, key, workers, runner_timeout)
    if not specs:
        raise TuningError("tune: no model given")
    names = [_model_name(s, i) for i, s in enumerate(specs)]
    lowered = [(name, lower_for_tuning(load_model(s, **load_args), tgt, options)) for name, s in zip(names, specs)]
    calls = Counter((name, kernel) for name, mod in lowered for kernel in kernel_calls(mod["main"]))
    bindings = {(name, kernel): b for name, mod in lowered
                for kernel, b in kernel_bindings(mod, bounds_of(mod["main"])).items()}
    tasks = st.extract_tasks(lowered, tgt, calls, bindings, options)
    in_tasks = {use for t in tasks for use in t.uses}
    symbolic = [f"{name}: {gv.name_hint} ({', '.join(st.symbolic_dims(f))})" for name, mod in lowered
                for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc) and st.symbolic_dims(f)
                and (name, gv.name_hint) not in in_tasks]
    if not tasks:
        if symbolic:
            raise TuningError(f"tune: every kernel of {', '.join(names)} has symbolic extents and a default "
                              "rule with no tunable choices; pin the dims to tune for (--shape "
                              "INPUT=D0,D1,...): the records then serve a compile with the same shapes")
        raise TuningError(f"tune: {', '.join(names)} has no Emit kernels to tune")

    wdir = Path(work_dir)
    db = open_database(wdir, create=True)  # validates the files before anything is written
    choices = load_choices(wdir)
    spaces = [None if t.bindings else design_spaces(t.workload, tgt, options) for t in tasks]
    caps = [space_count(s) for s in spaces]
    shares = ([trials_per_task if cap is None else min(cap, trials_per_task) for cap in caps] if trials_per_task
              else trial_shares(trials, [t.cost for t in tasks], caps))
    tools = st.Tools(tgt, builder_timeout, runner_timeout, tracker, workers, options)
    knobs = option_knobs(options)  # saved with each outcome under other knobs than the defaults
    result = TuneResult(wdir, tgt, names, measured_on=where, symbolic=symbolic, time_budget=time_budget)
    bar = tqdm(total=min(trials, sum(shares)), unit="trial", disable=not progress, desc="tune")
    baselines: dict[str, sm.Baseline] = {}
    started = time.monotonic()  # the search's clock (time_budget)
    ends = None if time_budget is None else started + time_budget
    if time_budget is not None:
        result.search_budget = time_budget * (1 - IN_MODEL_SHARE) if time_in_model else time_budget
    search_ends = None if ends is None else started + result.search_budget
    with st.cpu_intrinsics_only(tgt), contextlib.closing(bar):
        for index, (task, share, task_spaces) in enumerate(zip(tasks, shares, spaces)):
            if search_ends is not None and time.monotonic() > search_ends:
                result.over_budget.append(task.key)
                continue
            bar.set_description(f"tune {index + 1}/{len(tasks)} {task.kind}")
            try:
                out = _tune_task(task, index, db, tools, share, trials - result.measured, result, bar,
                                 choices.get(task.key), task_spaces, baselines, search_ends)
            except st.TuningFailed as err:
                model, kernel = task.uses[0]
                raise TuningError(f"tuning kernel {kernel} of {model} failed: {err}") from err
            if out is None:
                result.untuned.append(task.key)
                continue
            result.tasks.append(out)
            choices[task.key] = out.to_json() | {"uses": [list(u) for u in task.uses]} | \
                ({"options": knobs} if knobs else {})
            _save_choices(wdir, tgt, choices)
    if time_in_model:
        _time_in_model(lowered, tasks, db, baselines, result, choices, threads, progress, options, ends)
    return result


def _time_in_model(lowered: list, tasks: list, db: Any, baselines: dict, result: TuneResult, choices: dict,
                   threads: int | None, progress: bool, options: CompileOptions | None = None,
                   deadline: float | None = None) -> None:
    """Choose each tuned task's record by its time in the models (``in_models``), as many
    of its records as fit before ``deadline``, and save."""
    models = [tm.TimedModel(name, mod, inputs) for name, mod in lowered
              if (inputs := tm.model_inputs(mod)) is not None]
    by_key = {t.key: t for t in result.tasks if t.bindings is None}
    offered = {t.key: tm.candidates(db, t, baselines[t.key]) for t in tasks
               if t.key in by_key and t.key in baselines}
    for key, records in offered.items():
        out = by_key[key]
        if not records and out.tuned_s and out.default_s and out.tuned_s > tm.PLAUSIBLE * out.default_s:
            result.not_timed[key] = (f"its best record took {out.tuned_s / out.default_s:.2f}x the default's "
                                     f"kernel time (over {tm.PLAUSIBLE:.2f}x: no win there is plausible)")
    offered = {k: c for k, c in offered.items() if c}
    if not models or not offered:
        return
    if all(by_key[k].skipped and by_key[k].in_model is not None for k in offered):
        result.in_model = "kept the choices an earlier run made in the model(s)"
        return
    fit = tm.variants_that_fit(models)  # every variant is held at once, with its weights
    if fit < 2 * tm.CONFIRM_BUILDS:
        result.in_model = (f"not timed in the model(s): {2 * tm.CONFIRM_BUILDS} builds of their weights would "
                           "not fit in half the free memory; the kernel times chose")
        return
    if deadline is not None and time.monotonic() >= deadline:
        result.in_model = "not timed in the model(s): the search spent the whole time budget; the kernel times chose"
        return
    offered = {k: c[:fit - 1] for k, c in offered.items()}
    steps = len(models) * (tm.rounds(offered) + 2 * tm.CONFIRM_BUILDS) + 2 * tm.MODEL_TURNS
    with tqdm(total=steps, disable=not progress, desc="time in the model") as bar:
        try:
            timing = tm.choose(models, tasks, offered, result.target, result.work_dir, choices, threads,
                               lambda: bar.update(1), options, deadline)
        except tm.OutOfTime as err:
            result.in_model = f"not timed in the model(s): {err}; the kernel times chose"
            return
    for key, choice in timing.choices.items():
        out = by_key[key]
        out.choice, out.record, out.in_model = (("tuned" if choice.record else "default"), choice.record,
                                                choice.to_json())
        choices[key] = choices[key] | out.to_json()
    _save_choices(result.work_dir, result.target, choices)
    result.in_model = timing.summary()


def _check_seconds(name: str, value: Any) -> None:
    """Raise ``TuningError`` unless ``value`` is a finite number of seconds > 0."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (is_number and math.isfinite(value) and value > 0):
        raise TuningError(f"tune: {name}={value!r}; give a number of seconds > 0")


def _remote(rpc: str | None, key: str | None, workers: int | None, timeout_s: float) -> tuple[Any, int, str]:
    """The tracker to measure on (None: this machine), its sessions limited to ``timeout_s``
    (whole seconds), the parallel sessions, and a label."""
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
               bar: Any, saved: dict | None, spaces: list | None, baselines: dict,
               deadline: float | None = None) -> Any:
    """Seed, search and judge one task; None when it gets no trials (then it is not even
    seeded) or the run's are spent.  A task already searched for its trials keeps the
    outcome an earlier run saved.  Past ``deadline`` (``time.monotonic()``) the search stops
    after the batch it is measuring, and the task is judged on what was measured."""
    if per_task <= 0:
        return None
    if task.bindings:
        return _tune_symbolic_task(task, tools, per_task, left, result, bar, saved)
    baseline = baselines[task.key] = sm.seed_default(task, result.target, db, tools, spaces)
    done = len(sm.tuned_records(db, task, baseline))
    budget = min(per_task - done, left)
    if budget <= 0 and done < per_task:
        return None
    if budget <= 0 and saved is not None:
        return sm.TaskOutcome.from_json(task.key, saved, skipped=True)

    def step(n: int) -> None:
        result.measured += n
        bar.update(n)

    exhaustive = space_count(spaces) is not None  # nothing sampled: the spaces are the candidates
    # our structural neighbours: every one when nothing is sampled, else half the trials and the search the rest
    if spaces and (budget > 1 or exhaustive):
        measured = sm.measure_spaces(task, result.target, db, tools, spaces, budget if exhaustive else budget // 2)
        step(measured)
        budget -= measured
    if budget > 0 and not exhaustive and deadline is not None and time.monotonic() > deadline:
        result.cut_short.append(task.key)  # the neighbours took the time left: no search
    elif budget > 0 and not exhaustive:
        try:
            if st.search(task, result.target, db, budget, tools, work_dir=str(result.work_dir), on_batch=step,
                         seed=index, spaces=spaces, deadline=deadline):
                result.cut_short.append(task.key)
        except st.SearchFailed as err:
            model, kernel = task.uses[0]
            result.search_failed.append(f"{kernel} of {model}: {err}")
            _LOG.warning("tune: %s of %s: %s; the task keeps what was measured before", kernel, model, err)
    return sm.outcome(task, result.target, db, baseline, tools, skipped=done >= per_task)


def _tune_symbolic_task(task: Any, tools: Any, per_task: int, left: int, result: TuneResult, bar: Any,
                        saved: dict | None) -> Any:
    """Time the rule choices of a kernel with symbolic extents at its bindings
    (``schedules.tuning.symbolic``); an outcome saved for as many trials is kept."""
    rule, choices = task_choices(task, result.target, tools.options)
    wanted = min(per_task, len(choices) - 1)  # the candidates besides the default
    if wanted <= 0:
        return None
    if saved is not None and "plan" in saved and int(saved.get("trials", 0)) >= wanted:
        return sm.TaskOutcome.from_json(task.key, saved, skipped=True)
    budget = min(wanted, left)
    if budget <= 0:
        return None

    def step(n: int) -> None:
        result.measured += n
        bar.update(n)

    return tune_choices(task, result.target, tools, budget, step, rule, choices)
