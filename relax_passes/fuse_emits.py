"""FuseEmits: replace convex subgraphs of Emits by library Emits, where the facts allow.

Preconditions: a lifted module (LiftEmits); facts come from PropagateContracts'
analysis. Runs in the fixpoint with EliminateEmits and MaterializeEmits, before
LowerEmits; re-propagate afterwards. The decisions are ``fusion_planner``'s; this pass is
the ``EmitRewrite`` walk that applies them through ``group_rewrite``.

1. Library candidates (``aicf_tvm.library``): ``relax.dpl`` patterns matched on the
   op-level view of the DAG (each single-op Emit call seen as the op it wraps).
2. Each match S is judged (``aicf_tvm.core.legality``): convex (a match that is not
   first gives back the shared view chains on its input side, which a pattern's longest
   view chain took in: ``FusionPlanner._without_shared_input_views``); no opaque member
   and no effectful Emit inside its span touching its values; ``F ⊢ Requires(E*)``
   on boundary facts; ``Provides(E*) ⊑ Provides(S)`` on numerics. Every verdict goes
   to the report with the failing component and both lattice values.
3. The planner takes legal matches by benefit (intermediate bytes removed), never
   two that overlap: sorting makes it O(n log n) in the number of matches.
4. What is left is grouped generically (``generic_groups``): elementwise, broadcast,
   injective and view Emits join the group of a producer (``fused_elementwise``); an
   elementwise epilogue joins a reduction, pool, norm, GEMM or convolution group
   (``fused_reduce_epilogue`` for a plain reduction), a DAG of them (a decomposed
   tanh-GELU reading the GEMM output three times) too, when its values stay inside the
   group: every group ends with one output, convex.

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
