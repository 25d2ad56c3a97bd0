"""A tuned choice of a rule's own tunables, applied at compile time.

``aicf_tuning.json`` records, for a kernel tuned in its rule's choices (``tune_symbolic``),
``{"rule": NAME, "choice": {...}}``; ``select`` schedules the kernel by it through the
rule's ``apply_choice``; ``tunable_rule`` finds the rule whose choices a kernel is tuned in.
Both build the rules with the ``CompileOptions`` of the compile or the tuning run
(``default_rules(target, options)``): a choice is replayed with the knobs it was tuned under.
Kept apart from ``tune_symbolic`` so that ``select`` and ``tune``
(which the tuner imports) do not import the tuner back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tvm
from tvm import tirx

from aicf_tvm.core.options import CompileOptions
from schedules.rules import default_rules


def apply_choice(func: tirx.PrimFunc, target: tvm.target.Target, plan: Mapping[str, Any],
                 options: CompileOptions | None = None) -> Any:
    """``func`` scheduled by the saved ``plan`` (its rule's ``apply_choice``, the rule with
    the knobs of ``options``); None when that rule no longer takes ``func`` or offers the
    choice (the default rule then runs)."""
    for rule in default_rules(target, options):
        if type(rule).__name__ == plan["rule"] and hasattr(rule, "apply_choice"):
            return rule.apply_choice(func, target, plan["choice"])
    return None


def choice_label(plan: Mapping[str, Any]) -> str:
    """How a kernel scheduled by ``plan`` names its schedule (``explain``, ``kernels``)."""
    return f"tuned {plan['rule']}(" + ", ".join(f"{k}={v}" for k, v in plan["choice"].items()) + ")"


def tunable_rule(func: tirx.PrimFunc, target: tvm.target.Target, options: CompileOptions | None = None) -> Any:
    """The rule (with the knobs of ``options``) that schedules ``func`` by default when it
    offers ``choices``, else None."""
    for rule in default_rules(target, options):
        try:
            if rule.apply(func, target, False) is None:
                continue
        except Exception:  # noqa: BLE001 - a failing rule is skipped, as at compile time
            continue
        return rule if hasattr(rule, "choices") and hasattr(rule, "apply_choice") else None
    return None
