"""Default TensorIR schedules: rule lists per target and the pass that applies them.

A rule follows ``tvm.s_tir.dlight``: ``apply(func, target, tunable) -> Schedule | None``,
None meaning "not mine".  ``apply_default_schedules(target)`` is a module pass that gives
every PrimFunc not yet scheduled (attr ``tirx.is_scheduled``) the first schedule a rule of
``default_rules(target)`` returns, and marks it scheduled.  It runs after ``LegalizeOps``/
``FuseTIR`` and before the backend's dataflow lowering, like ``dlight.ApplyDefaultSchedule``;
unlike it, it takes the target as an argument (falling back to ``Target.current()``, so it
also works inside ``with target:``), and a rule that raises is skipped: a broken rule
costs speed, never the build.  No rule inlines a block that stores an immediate into
another (``schedules.constants``): TVM would fold it, unsoundly for IEEE or by raising
inside the primitive, which can abort the process.  Imports only TVM and the standard
library, and the core's ``CompileOptions`` (the rules' knobs).
"""

import logging
from typing import Protocol

import tvm
from tvm import tirx
from tvm.ir import IRModule
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.target import Target

from aicf_tvm.core.emit import PLAN_ATTR, is_scheduled
from aicf_tvm.core.options import CompileOptions

from .cpu.common import plan_of
from .rules import default_rules

__all__ = ["ScheduleMemo", "apply_default_schedules", "default_rules", "is_scheduled", "schedule_func"]

_LOG = logging.getLogger(__name__)


class ScheduleMemo(Protocol):
    """Where ``apply_default_schedules`` finds a kernel scheduled before (the driver's
    kernel cache): ``get`` gives the scheduled form of an unscheduled PrimFunc for a target,
    or None; ``put`` records one."""

    def get(self, func: tirx.PrimFunc, target: Target) -> tirx.PrimFunc | None: ...

    def put(self, func: tirx.PrimFunc, target: Target, scheduled: tirx.PrimFunc) -> None: ...


def schedule_func(
    func: tirx.PrimFunc, target: Target, rules: list[ScheduleRule]
) -> tirx.PrimFunc | None:
    """``func`` scheduled by the first rule that applies, marked scheduled; None if none."""
    for rule in rules:
        try:
            sch = rule.apply(func, target, False)
        except Exception as err:  # noqa: BLE001 - a failing rule must not fail the build
            _LOG.warning("schedule rule %r failed: %s", rule, err)
            continue
        if isinstance(sch, list):
            sch = sch[0] if sch else None
        if sch is not None:
            scheduled = sch.mod["main"].with_attr("tirx.is_scheduled", True)
            if (plan := plan_of(scheduled)) is not None:
                scheduled = scheduled.with_attr(PLAN_ATTR, plan)
            return scheduled.with_attr("aicf.schedule", type(rule).__name__)
    return None


def apply_default_schedules(target: Target | None = None, options: CompileOptions | None = None,
                            memo: ScheduleMemo | None = None) -> tvm.transform.Pass:
    """Module pass scheduling every unscheduled PrimFunc with ``default_rules``, whose
    knobs come from ``options`` (the default ones when None).

    The target comes from the PrimFunc's ``target`` attr, else ``target``, else the
    enclosing ``with target:``. ``memo`` (made for ``options``) gives the kernels it holds
    as they were scheduled before and records the others.
    """

    @tvm.transform.module_pass(opt_level=0, name="ApplyDefaultSchedules")
    def _apply(mod: IRModule, _ctx: tvm.transform.PassContext) -> IRModule:
        updates = {}
        for gvar, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or is_scheduled(func):
                continue
            func_target = func.attrs.get("target") if func.attrs is not None else None
            func_target = func_target or target or Target.current(allow_none=True)
            if func_target is None:
                raise ValueError(
                    f"apply_default_schedules: no target for PrimFunc {gvar.name_hint}; "
                    "pass one (apply_default_schedules(target)) or run inside `with target:`"
                )
            scheduled = memo.get(func, func_target) if memo is not None else None
            if scheduled is None:
                scheduled = schedule_func(func, func_target, default_rules(func_target, options))
                if scheduled is not None and memo is not None:
                    memo.put(func, func_target, scheduled)
            if scheduled is not None:
                updates[gvar] = scheduled
        for gvar, func in updates.items():
            mod[gvar] = func
        return mod

    return _apply
