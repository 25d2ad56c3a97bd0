"""explain: a readable table of a module's Emits, their contracts, and fusion decisions."""

from __future__ import annotations

import tvm

from aicf_tvm.core.emit_table import emit_calls, emit_table
from aicf_tvm.core.report import FusionReport
from aicf_tvm.driver.compiled import kernels_of
from aicf_tvm.runtime.targets import describe
from relax_passes import LiftEmits, PropagateContracts


def lift_and_propagate(mod: tvm.IRModule) -> tvm.IRModule:
    """LiftEmits then PropagateContracts (a no-op lift on an already lifted module)."""
    return PropagateContracts()(LiftEmits()(mod))


def explain(mod: tvm.IRModule, report: FusionReport | None = None) -> str:
    """The Emit table of ``mod`` (lifted and propagated first when needed), and the
    fusion report when one is given."""
    if not emit_calls(mod):
        mod = lift_and_propagate(mod)
    text = emit_table(mod)
    if report is not None:
        text += "\n\n" + str(report)
    return text


def kernel_selection(lowered: tvm.IRModule, target: tvm.target.Target) -> str:
    """Per kernel of a lowered module: its Emit kind and where its schedule came from
    (a tuned record, a tuned choice of our rule for a kernel with symbolic extents, one of
    our default rules, or none), and the plan the rule chose where it notes one (the GEMM's
    and attention's tiles and layouts)."""
    kernels = kernels_of(lowered)
    rows = [("#", "kernel", "Emit kind", "schedule", "plan")]
    rows += [(str(i), k.name, k.kind, k.schedule, k.plan) for i, k in enumerate(kernels)]
    widths = [max(len(r[c]) for r in rows) for c in range(5)]
    lines = [f"kernel selection for {describe(target)}: tuned record or choice > default rule > fallback"]
    lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)
