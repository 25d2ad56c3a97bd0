"""MaterializeEmits: insert the Emits that make a refused candidate legal, and do at
compile time the work that needs only constants (docs/design.md §6).

Three jobs, one module each, each also a pass of its own; this pass runs them on every
dataflow block of ``main`` in this order, on one analysis:

1. Layouts (``materialize_layouts``, pass ``MaterializeLayouts``). Given the target's
   vector width (``lanes``), chains of convolutions are blocked (``NCHW{b}c``) where the
   cost model says so, with ``layout_transform`` Emits at the chains' boundaries only. A
   block whose layouts changed gets nothing else this round.
2. Insert (``insert_emits``, pass ``InsertEmits``). A library candidate refused only on
   boundary inputs' shape/stride facts gets the ``broadcast_to`` or contiguous copy that
   makes them entail its requirement, when insert-and-fuse costs less than it saves.
3. Fold (``fold_constant_emits``, pass ``FoldConstantEmits``). An effect-free single-op
   Emit whose inputs are all constants is evaluated now (``FoldConstantIEEE``). It sees
   the block as it was before the inserts: an inserted Emit is folded in the next round.

Layouts the kernel itself wants (the GEMM's packed B) are materialized on constants
after scheduling, by ``prepack_weights``.

Sound: each job is (see its module); running them in sequence composes rewrites that
each keep every value the block computes.
Runs in the pipeline's fixpoint after EliminateEmits, before FuseEmits; re-propagate afterwards.
"""

from __future__ import annotations

import tvm
from tvm import relax

from aicf_tvm.core.candidate import Candidate, registered_candidates
from aicf_tvm.core.emit_graph import EmitGraph
from aicf_tvm.core.facts import FactTable
from aicf_tvm.core.report import FusionReport

from .emit_rewrite import EmitRewrite
from .fold_constant_emits import fold_and_tidy, fold_constant_emits
from .insert_emits import broadcasts_to, insert_block
from .materialize_layouts import materialize_layouts


@tvm.transform.module_pass(opt_level=0, name="MaterializeLayouts")
class MaterializeLayouts(EmitRewrite):
    """Block the convolution chains of ``main`` worth it for vectors of ``lanes``; report each chain."""

    def __init__(self, lanes: int, report: FusionReport | None = None, func_name: str = "main") -> None:
        super().__init__(report, func_name)
        self.lanes = lanes

    def rewrite_block(self, bb: relax.BlockBuilder, graph: EmitGraph,
                      facts: FactTable) -> relax.DataflowBlock | None:
        relaid = materialize_layouts(bb, graph, self.lanes, self.report)
        return None if relaid is None else relax.DataflowBlock(relaid)

    def finish(self, mod: tvm.IRModule) -> tvm.IRModule:
        return fold_and_tidy(mod)


@tvm.transform.module_pass(opt_level=0, name="MaterializeEmits")
class MaterializeEmits(EmitRewrite):
    """Block convolution chains (given ``lanes``), insert broadcasts that enable fusion, fold
    constant-only Emits; report all three."""

    def __init__(self, report: FusionReport | None = None, candidates: tuple[Candidate, ...] | None = None,
                 func_name: str = "main", lanes: int | None = None) -> None:
        super().__init__(report, func_name)
        if candidates is None:
            candidates = registered_candidates()
        self.candidates = tuple(sorted(candidates, key=lambda c: -c.priority))
        self.lanes = lanes

    def rewrite_block(self, bb: relax.BlockBuilder, graph: EmitGraph,
                      facts: FactTable) -> relax.DataflowBlock | None:
        relaid = materialize_layouts(bb, graph, self.lanes, self.report) if self.lanes else None
        if relaid is not None:
            return relax.DataflowBlock(relaid)
        inserted = insert_block(bb, graph, facts, self.candidates, self.report)
        bindings = list(graph.block.bindings) if inserted is None else inserted
        folded = fold_constant_emits(graph, graph.mod, bindings, self.report)
        return relax.DataflowBlock(bindings) if inserted is not None or folded else None

    def finish(self, mod: tvm.IRModule) -> tvm.IRModule:
        return fold_and_tidy(mod)


__all__ = ["MaterializeEmits", "MaterializeLayouts", "broadcasts_to"]
