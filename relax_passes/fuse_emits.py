"""FuseEmits: replace convex subgraphs of Emits by library Emits, where the facts allow.

Preconditions: a lifted module (LiftEmits); facts come from PropagateContracts'
analysis. Runs in the fixpoint with EliminateEmits and MaterializeEmits, before
LowerEmits; re-propagate afterwards. The decisions are ``fusion_planner``'s; this pass is
the ``EmitRewrite`` walk that applies them through ``group_rewrite``.

The steps (library candidates matched and judged, the legal ones taken by benefit, the
rest grouped generically) are told in ``fusion_planner``'s docstring.

Sound because a fused Emit's body inlines its members' bodies in order: it computes
exactly what S computed (with intermediates in their own dtypes); the only change a
candidate may make, a forced accumulator, is refused unless it is no weaker.
"""

from __future__ import annotations

import tvm

from aicf_tvm.core.candidate import Candidate, registered_candidates
from aicf_tvm.core.emit_graph import EmitGraph
from aicf_tvm.core.facts import FactTable
from aicf_tvm.core.report import FusionReport

from .emit_rewrite import EmitRewrite
from .fusion_planner import FusionPlanner, op_view
from .generic_groups import STRUCTURAL_VIEWS, is_structural_view
from .group_rewrite import Group


@tvm.transform.module_pass(opt_level=0, name="FuseEmits")
class FuseEmits(EmitRewrite):
    """Fuse the Emits of ``main``; decisions are appended to ``self.report``."""

    def __init__(self, candidates: tuple[Candidate, ...] | None = None,
                 report: FusionReport | None = None, func_name: str = "main") -> None:
        super().__init__(report, func_name)
        if candidates is None:
            candidates = registered_candidates()
        self.candidates = tuple(sorted(candidates, key=lambda c: -c.priority))

    def plan(self, graph: EmitGraph, facts: FactTable) -> list[Group]:
        return FusionPlanner(graph, facts, self.candidates, self.report).plan()


__all__ = ["STRUCTURAL_VIEWS", "FuseEmits", "is_structural_view", "op_view"]
