"""Tuning kernels with symbolic extents: our rule's choices, timed at representative bindings.

MetaSchedule times a kernel on arguments of one shape, and a trace recorded on one
specialization of a symbolic kernel need not replay on the symbolic function (its
``sample_perfect_tile`` decisions divide a static extent).  So a kernel with symbolic
extents is tuned only in the choices of its default rule that mean the same at every
binding, the rule's ``choices(func, target)`` (``Gemm.choices``: the register tile
``mr x nr``, whether B is packed, which loops run in parallel; a rule without them keeps
its default schedule).  Each candidate is the symbolic kernel itself, scheduled by the
rule with that choice, built once as ``compile`` builds it (``tune._build``) and timed on
arguments of each representative binding.

Representative bindings (``representative_values``): each symbolic dim of the model with
bounds ``lo:hi`` (``tir_var_*_bound``: ``Dim(max=...)``, ``--dim seq=1:512``) is timed at
``lo``, at the geometric middle ``round(sqrt(lo * hi))`` and at ``hi`` (1, 23, 512 for
1:512): a GEMM's speed changes with the order of magnitude of M, not its last digits.
Without a lower bound ``lo`` is 1, without an upper one ``hi`` is ``DEFAULT_UPPER``.  The
dims move together (the i-th binding gives every dim its i-th value), and a kernel's own
extents follow from its call site (``batch * seq`` rows: ``kernel_bindings``).  A kernel
that several models share is timed at the bindings of its first use.

Judging: in each turn, a candidate's time over the default's is their geometric mean over
the bindings (every binding weighs the same, whatever its size; a sum of times would see
only the largest).  All budgeted candidates are timed once, then the ``CONFIRM_TOP`` best
and the default again in ``CONFIRM_ROUNDS`` turns; a candidate is chosen only when the
median of its turns is under ``WIN_MARGIN``, as a record is (``schedules.tuning.measure.outcome``).
The choice is saved in ``aicf_tuning.json`` (``plan``: the rule and its choice, with the
bindings timed); ``compile`` schedules the symbolic kernel by it (``apply_choice``), and a
choice the rule no longer offers for the kernel keeps the default schedule.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
from collections.abc import Callable, Mapping
from typing import Any

import tvm
from tvm import relax, sym, tirx
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

from aicf_tvm.core.options import CompileOptions
from schedules.tuning.measure import CONFIRM_ROUNDS, CONFIRM_TOP, WIN_MARGIN, TaskOutcome
from schedules.tuning.space import timed_form
from schedules.tuning.tasks import Task, Tools, TuningFailed, mean_secs

from .choices import apply_choice, choice_label, tunable_rule

DEFAULT_UPPER = 512  # the largest value timed of a dim the model does not bound
Binding = dict[str, int]


def representative_values(low: int | None, high: int | None) -> list[int]:
    """The values a dim bounded by ``low:high`` is timed at (module docstring)."""
    lo = max(1, low if low is not None else 1)
    hi = max(lo, high if high is not None else DEFAULT_UPPER)
    return sorted({lo, round(math.sqrt(lo * hi)), hi})


def model_bindings(func: relax.Function, bounds: Mapping[str, tuple[int | None, int | None]]) -> list[dict]:
    """The representative bindings of ``func``'s symbolic dims, ``{tirx.Var: value}`` each."""
    dims = list(relax.analysis.defined_symbolic_vars(func))
    values = {v: representative_values(*bounds.get(v.name, (None, None))) for v in dims}
    count = max((len(vals) for vals in values.values()), default=0)
    return [{v: vals[min(i, len(vals) - 1)] for v, vals in values.items()} for i in range(count)]


def _tensor_shapes(ty: Any) -> list[list[Any]]:
    fields = ty.fields if isinstance(ty, relax.TupleType) else [ty]
    return [list(f.shape.values) if isinstance(getattr(f, "shape", None), relax.ShapeExpr) else []
            for f in fields]


def _extents_at_call(call: relax.Call, func: tirx.PrimFunc) -> dict[str, Any] | None:
    """``{kernel var name: its value at the call, in the model's dims}``; None when an
    extent of ``func`` is no bare dim of an argument's or the result's shape."""
    if not isinstance(call.args[1], relax.Tuple):
        return None
    shapes = [s for arg in call.args[1].fields for s in _tensor_shapes(arg.ty)] + _tensor_shapes(call.ty)
    params = [getattr(p.ty, "shape", None) for p in func.params]
    if len(shapes) != len(params) or any(p is None for p in params):
        return None
    site: dict[str, Any] = {}
    for dims, values in zip(params, shapes):
        for dim, value in zip(dims, values if len(values) == len(dims) else []):
            if isinstance(dim, tirx.Var):
                site.setdefault(dim.name, value)
    names = {v.name for dims in params for d in dims for v in tirx.analysis.undefined_vars(d)}
    return {name: site[name] for name in sorted(names)} if names and names <= set(site) else None


def _evaluated(extents: Mapping[str, Any], binding: Mapping[Any, int]) -> Binding | None:
    """The extents at one binding of the model's dims; None if one is not a constant then."""
    analyzer = sym.Analyzer()
    for var, value in binding.items():
        analyzer.bind(var, tvm.ir.Range.from_min_extent(value, 1))
    values = {name: analyzer.simplify(expr) for name, expr in extents.items()}
    if not all(isinstance(v, tirx.IntImm) for v in values.values()):
        return None
    return {name: int(v.value) for name, v in values.items()}


def kernel_bindings(mod: tvm.IRModule,
                    bounds: Mapping[str, tuple[int | None, int | None]]) -> dict[str, list[Binding]]:
    """``{PrimFunc name: bindings of its symbolic extents}`` for the kernels ``main`` calls
    with symbolic extents, each extent evaluated from its (first) call site at the model's
    representative bindings.  A kernel with an extent its arguments' shapes do not give
    (a scalar parameter) is left out: it cannot be timed on tensors alone."""
    main = mod["main"]
    bindings = model_bindings(main, bounds)
    out: dict[str, list[Binding]] = {}
    for block in main.body.blocks:
        for binding in block.bindings:
            call = binding.value
            if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)
                    and call.op.name == "relax.call_tir") or call.args[0].name_hint in out:
                continue
            extents = _extents_at_call(call, mod[call.args[0]])
            values = [_evaluated(extents, b) for b in bindings] if extents else []
            if values and all(v is not None for v in values):
                out[call.args[0].name_hint] = values
    return out


def arg_infos(mod: tvm.IRModule, binding: Mapping[str, int]) -> list[ms.arg_info.TensorInfo]:
    """The arguments ``mod``'s kernel is timed on at ``binding``, its layout rewrites taken
    out as the build takes them out (what ``ArgInfo.from_entry_func`` gives a static one)."""
    func = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)["main"]
    analyzer = sym.Analyzer()
    for dims in (p.ty.shape for p in func.params):
        for var in (v for d in dims for v in tirx.analysis.undefined_vars(d)):
            analyzer.bind(var, tvm.ir.Range.from_min_extent(binding[var.name], 1))
    return [ms.arg_info.TensorInfo(str(p.ty.dtype), [int(analyzer.simplify(d)) for d in p.ty.shape])
            for p in func.params]


def measure_at(mods: list[tvm.IRModule], bindings: list[Binding], target: tvm.target.Target,
               tools: Tools, rounds: int) -> list[list[list[float]] | str]:
    """Per module, its seconds per call at each binding in each of ``rounds`` turns (a turn
    times every module at every binding once), or the error that stopped it."""
    builder, runner = tools.builder, tools.runner
    built = builder.build([ms.builder.BuilderInput(mod, target) for mod in mods])
    device = "cuda" if "gpu" in target.keys else "cpu"
    out: list[Any] = [str(b.error_msg) if b.error_msg else [] for b in built]
    try:
        for _ in range(rounds):
            live = [i for i, o in enumerate(out) if not isinstance(o, str)]
            inputs = [(i, ms.runner.RunnerInput(built[i].artifact_path, device, arg_infos(mods[i], b)))
                      for i in live for b in bindings]
            turn: dict[int, list[float]] = {i: [] for i in live}
            for (i, _), future in zip(inputs, runner.run([x for _, x in inputs]) if inputs else []):
                result = future.result()
                if result.error_msg:
                    out[i] = str(result.error_msg)
                elif not isinstance(out[i], str):
                    turn[i].append(mean_secs(result.run_secs))
            for i in live:
                if not isinstance(out[i], str):
                    out[i].append(turn[i])
    finally:
        for b in built:
            if b.artifact_path:
                shutil.rmtree(os.path.dirname(b.artifact_path), ignore_errors=True)
    return out


def _ratio(turn: list[float], default: list[float]) -> float:
    """The geometric mean over the bindings of a candidate's time over the default's."""
    return math.exp(statistics.fmean(math.log(t / d) for t, d in zip(turn, default)))


def _geomean_median(turns: list[list[float]]) -> float:
    """The geometric mean over the bindings of each binding's median turn."""
    return math.exp(statistics.fmean(math.log(statistics.median(col)) for col in zip(*turns)))


def task_choices(task: Task, target: tvm.target.Target,
                 options: CompileOptions | None = None) -> tuple[Any, list[tuple[dict, Any]]]:
    """The task's tunable rule (with the knobs of ``options``) and its choices with their
    schedules, the default's first."""
    func = task.workload["main"]
    rule = tunable_rule(func, target, options)
    return rule, (rule.choices(func, target) if rule is not None else [])


def tune_choices(task: Task, target: tvm.target.Target, tools: Tools, budget: int,
                 on_batch: Callable[[int], None], rule: Any, choices: list[tuple[dict, Any]]) -> TaskOutcome:
    """Time up to ``budget`` of ``rule``'s ``choices`` after the first (the default plan's;
    nearest the default first) against the default at the task's bindings and judge them
    (module docstring)."""
    names = [",".join(f"{k}={v}" for k, v in b.items()) for b in task.bindings]
    result = TaskOutcome(task.key, task.kind, 0, None, None, "default", bindings=names)
    if len(choices) < 2 or budget <= 0:
        return result
    (_, default), candidates = choices[0], choices[1:1 + budget]
    mods = [timed_form(s.mod) for s in (default, *(s for _, s in candidates))]
    screen = measure_at(mods, task.bindings, target, tools, rounds=1)
    on_batch(len(candidates))
    if isinstance(screen[0], str):
        raise TuningFailed(f"task {task.key}: the default schedule did not run ({screen[0].strip()[-300:]})")
    ran = [(i, _ratio(runs[0], screen[0][0])) for i, runs in enumerate(screen[1:]) if not isinstance(runs, str)]
    result.trials = len(candidates)
    if not ran:
        return result
    best = [i for i, _ in sorted(ran, key=lambda x: x[1])[:CONFIRM_TOP]]
    confirm = measure_at([mods[0], *(mods[1 + i] for i in best)], task.bindings, target, tools,
                         rounds=CONFIRM_ROUNDS)
    if isinstance(confirm[0], str):
        return result
    judged = [(statistics.median(_ratio(t, d) for t, d in zip(runs, confirm[0])), i, runs)
              for i, runs in zip(best, confirm[1:]) if not isinstance(runs, str)]
    result.default_s = _geomean_median(confirm[0])
    if not judged:
        return result
    ratio, index, runs = min(judged, key=lambda x: x[0])
    result.tuned_s = _geomean_median(runs)
    if ratio < WIN_MARGIN:
        result.choice = "tuned"
        result.plan = {"rule": type(rule).__name__, "choice": candidates[index][0]}
    return result


__all__ = [
    "DEFAULT_UPPER",
    "apply_choice",
    "choice_label",
    "kernel_bindings",
    "representative_values",
    "task_choices",
    "tunable_rule",
    "tune_choices",
]
