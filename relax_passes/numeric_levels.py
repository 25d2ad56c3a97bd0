"""RelaxNumerics: the Emits whose kernels the ``relaxed`` numeric level changes, put at it.

Runs after the fusion fixpoint when ``CompileOptions(numerics="relaxed")`` asks for it
(``aicf_tvm.core.numerics``; docs/numerics.md, "Numeric levels").  An Emit function is
relaxed when its body calls an op whose kernel the level computes differently: exp,
sigmoid, tanh, erf (GELU's) and softmax's exp (in float32, ``schedules.cpu.relaxed_math``); in fused
attention also the softmax's row sums (per vector lane, ``schedules.cpu.attention``).
Such a function gets ``NUMERICS_ATTR`` = ``relaxed`` (``LowerEmits`` copies it onto the
kernel, where the schedule rules and ``VectorizeMath`` read it), its math tag and its
outputs' join ``approx:relaxed``, and the report an ``approximate:numerics_relaxed``
decision naming what changes.  Other Emits (a GEMM, a layer norm: nothing the level
changes) stay ``exact`` and are not listed.
"""

from __future__ import annotations

from dataclasses import replace

import tvm
from tvm import relax

from aicf_tvm.core.contract import EmitContract
from aicf_tvm.core.emit import EMIT_ATTR, emit_of
from aicf_tvm.core.lattice.numeric import MathTag
from aicf_tvm.core.numerics import NUMERICS_ATTR, RELAXED, RELAXED_MATH
from aicf_tvm.core.report import APPROXIMATE, Decision, FusionReport

# the ops whose kernels the level changes, and how (the report's note)
RELAXED_OPS = {
    "relax.exp": "exp in float32",
    "relax.sigmoid": "sigmoid in float32",
    "relax.nn.silu": "sigmoid in float32",
    "relax.tanh": "tanh in float32",
    "relax.nn.gelu_tanh": "tanh in float32",
    "relax.nn.gelu": "erf in float32",
    "relax.erf": "erf in float32",
    "relax.nn.softmax": "softmax's exp in float32",
    "relax.nn.log_softmax": "log_softmax's exp in float32",
}
# what the level changes in a kernel of these kinds besides its ops' own notes
KIND_NOTES = {"fused_attention": "the softmax's row sums per vector lane where the keys are whole vectors"}
DECISION = f"{APPROXIMATE}numerics_relaxed"


def relaxed_ops(func: relax.Function) -> list[str]:
    """The ``RELAXED_OPS`` ``func``'s body calls, in first-call order."""
    found: list[str] = []

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            name = expr.op.name
            if name in RELAXED_OPS and name not in found:
                found.append(name)

    relax.analysis.post_order_visit(func.body, visit)
    return found


def _relaxed_contract(contract: EmitContract, outputs: list[str]) -> EmitContract:
    provides = contract.provides
    tag = MathTag(RELAXED_MATH)
    for name in outputs:
        port = provides.port(name)
        numeric = replace(port.numeric, math=port.numeric.math.join(tag))
        provides = provides.with_port(name, replace(port, numeric=numeric))
    return replace(contract, provides=provides)


@tvm.transform.module_pass(opt_level=0, name="RelaxNumerics")
class RelaxNumerics:
    """Put every Emit function that calls a ``RELAXED_OPS`` op at the ``relaxed`` level,
    recording one decision per function in ``report``."""

    def __init__(self, report: FusionReport | None = None) -> None:
        self.report = report

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        for gv, func in list(mod.functions_items()):
            emit = emit_of(func) if isinstance(func, relax.Function) else None
            if emit is None or (ops := relaxed_ops(func)) == []:
                continue
            outputs = [p.name for p in emit.interface.outputs]
            emit = replace(emit, math=MathTag(emit.math).join(MathTag(RELAXED_MATH)).value,
                           contract=_relaxed_contract(emit.contract, outputs))
            mod[gv] = func.with_attr(EMIT_ATTR, emit.to_attr()).with_attr(NUMERICS_ATTR, RELAXED)
            if self.report is not None:
                notes = sorted({RELAXED_OPS[op] for op in ops})
                if emit.kind in KIND_NOTES:
                    notes.append(KIND_NOTES[emit.kind])
                self.report.add(Decision(DECISION, (gv.name_hint,), True,
                                         note=f"{emit.kind}: {'; '.join(notes)} (docs/numerics.md)"))
        return mod


__all__ = ["DECISION", "RELAXED_OPS", "RelaxNumerics", "relaxed_ops"]
