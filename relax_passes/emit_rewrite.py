"""EmitRewrite: the walk that every Emit-rewriting pass shares.

A pass over the Emits of one function (``main``) does the same five things: take the
contract facts of the function (``aicf_tvm.core.propagation.analysis_of``, computed once
per function and reused while the function and its Emits are unchanged), view each
dataflow block as an ``EmitGraph``, decide what to rewrite (recording every decision in
the pass's ``FusionReport``), rebuild the blocks it changed, and tidy the module (drop
the Emit functions no longer called). A subclass states only the decisions:

* ``plan(graph, facts) -> list[Group]``: groups of nodes, each replaced by one new Emit
  through ``group_rewrite`` (FuseEmits); or
* ``rewrite_block(bb, graph, facts) -> DataflowBlock | None``: its own rebuilt block
  (EliminateEmits, MaterializeEmits, FuseAdamSteps);

and, where it differs, ``finish(mod)`` (the tidying) and ``sweeps`` (how often to walk
again while the walk changes something: one removal can make its producer dead). A pass
is the subclass under TVM's ``module_pass`` decorator, as TVM's own Python passes are.

Sound: the walk only delivers facts and graphs and puts back what the subclass built; a
block the subclass leaves (``None``) is kept as it was, and a module no block of which
changed is returned as the same object, so the cached analysis still holds for it.
"""

from __future__ import annotations

import tvm
from tvm import relax

from aicf_tvm.core.emit_graph import EmitGraph
from aicf_tvm.core.facts import FactTable
from aicf_tvm.core.propagation import analysis_of
from aicf_tvm.core.report import FusionReport

from .group_rewrite import Group, drop_unused_emits, rewrite_block, with_blocks


class EmitRewrite:
    """The shared walk of an Emit pass; subclasses give ``plan`` or ``rewrite_block``."""

    sweeps = 1  # walks at most, while one changes the module

    def __init__(self, report: FusionReport | None = None, func_name: str = "main") -> None:
        self.report = report if report is not None else FusionReport()
        self.func_name = func_name

    # -- what a subclass states ------------------------------------------------------
    def plan(self, graph: EmitGraph, facts: FactTable) -> list[Group]:
        """The groups of ``graph`` to replace by one Emit each (none: the block stays)."""
        raise NotImplementedError(f"{type(self).__name__} gives plan() or rewrite_block()")

    def rewrite_block(self, bb: relax.BlockBuilder, graph: EmitGraph,
                      facts: FactTable) -> relax.DataflowBlock | None:
        """The block rebuilt, or None when it stays; by default ``plan``'s groups applied."""
        groups = self.plan(graph, facts)
        return rewrite_block(bb, graph, groups) if groups else None

    def finish(self, mod: tvm.IRModule) -> tvm.IRModule:
        """Tidy a changed module: the Emit functions no longer called go."""
        return drop_unused_emits(mod)

    # -- the walk --------------------------------------------------------------------
    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        if self.func_name not in [gv.name_hint for gv in mod.get_global_vars()]:
            return mod
        for _ in range(self.sweeps):
            new = self.sweep(mod)
            if new is mod:
                break
            mod = new
        return mod

    def sweep(self, mod: tvm.IRModule) -> tvm.IRModule:
        """One walk over the dataflow blocks of the function; ``mod`` itself when nothing changed."""
        facts = analysis_of(mod, self.func_name)
        self.func = func = mod[self.func_name]
        bb = relax.BlockBuilder(mod)
        self._blocks, changed, emit_cache = list(func.body.blocks), False, {}
        try:
            for k, block in enumerate(self._blocks):
                if not isinstance(block, relax.DataflowBlock):
                    continue
                self._at = k
                new = self.rewrite_block(bb, EmitGraph(mod, block, emit_cache), facts)
                if new is not None:
                    self._blocks[k], changed = new, True
            if not changed:
                return mod
            with_blocks(bb, mod, self.func_name, self._blocks)
        finally:
            self.func, self._blocks = None, []  # hold no module past the walk
        return self.finish(bb.get())

    def rest(self) -> relax.SeqExpr:
        """During ``rewrite_block``: what the function runs after the block (its later
        blocks and its result), as the walk found it."""
        return relax.SeqExpr(self._blocks[self._at + 1:], self.func.body.body)


__all__ = ["EmitRewrite"]
