"""CacheInPlace: a ``slice_scatter`` into a donated parameter -> rows written in place.

A decode step returns its KV cache with the new rows written: ``slice_scatter(cache, rows,
start, end, axis)``, which Relax defines as a new tensor, so a plain lowering copies the
whole cache every call (``max_length`` rows per layer) to write one row. The ``cache_write``
Emit (``aicf_tvm.core.kinds.cache``) writes the rows into the cache's own buffer instead:
its contract has ``cache`` = ReadWrite and the output MustAlias ``cache``. Legal only when

* ``cache`` is a parameter of the function that the caller donates (the function's
  ``aicf.donated_inputs`` attr names it: the caller never reads its old value again), and
* nothing else in the function reads it (no other Emit, no output): after the write the
  old value is gone;
* the slice has step 1 and the rows span the cache on every other axis.

The writes stay in the cache's bounds: ``0 <= start <= end <= cache.shape[axis]`` is a
shape requirement of ``slice_scatter`` (``relax_passes.shape_rules``), checked before any
kernel runs. Otherwise the Emit stays and copies; the report says which condition failed
and how many bytes each call copies. Runs after the fusion fixpoint, before LowerEmits,
and lowers at once (an in-place kernel has no pure Relax form), as FuseAdamSteps does.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

from aicf_tvm.core.emit import EMIT_ATTR
from aicf_tvm.core.emit_graph import EmitGraph, Node
from aicf_tvm.core.facts import FactTable
from aicf_tvm.core.kinds.cache import DONATED_INPUTS_ATTR, KIND, cache_write_emit, cache_write_kernel
from aicf_tvm.core.report import Decision

from .dataflow_rewrite import use_counts
from .emit_rewrite import EmitRewrite
from .fusion_planner import value_bytes
from .group_rewrite import body_at_call_site


def donated_inputs(func: relax.Function) -> list[str]:
    """The parameter names ``func``'s ``aicf.donated_inputs`` attr lists (none: [])."""
    if func.attrs is None or DONATED_INPUTS_ATTR not in func.attrs:
        return []
    return [str(n) for n in func.attrs[DONATED_INPUTS_ATTR]]


class _Write:
    """One ``slice_scatter`` Emit and the verdict on writing it in place."""

    def __init__(self, graph: EmitGraph, node: Node, func: relax.Function, donated: list[str]) -> None:
        self.node = node
        self.call = body_at_call_site(graph.mod, node)
        self.cache, self.rows = self.call.args[0], self.call.args[1]
        self.note = self._refusal(func, donated)

    @property
    def name(self) -> str:
        return self.cache.name if isinstance(self.cache, relax.Var) else str(self.cache)

    def _refusal(self, func: relax.Function, donated: list[str]) -> str:
        cache, rows = self.cache, self.rows
        if not isinstance(cache, relax.Var) or not any(cache.same_as(p) for p in func.params):
            return "the cache is no parameter of the function"
        if cache.name not in donated:
            return (f"the caller does not donate {cache.name} (the function's {DONATED_INPUTS_ATTR} "
                    "does not name it), so its old value must survive the call")
        if use_counts(func).get(cache, 0) != 1:
            return f"{cache.name} is read elsewhere in the function: writing it would change that read"
        step = self.call.args[4] if len(self.call.args) > 4 else None
        if step is not None and not (isinstance(step, tirx.IntImm) and step.value == 1):
            return "the slice's step is not 1"
        axis = int(self.call.attrs.axis) % int(cache.ty.ndim)
        dims_c, dims_r = list(cache.ty.shape.values), list(rows.ty.shape.values)
        analyzer = tvm.sym.Analyzer()
        for k, (c, r) in enumerate(zip(dims_c, dims_r)):
            if k != axis and not analyzer.can_prove_equal(c, r):
                return f"the rows do not span the cache on axis {k} ({r} vs {c})"
        return ""

    def decision(self) -> Decision:
        size = value_bytes(self.cache)  # 0: a shape that is not static
        copy = f"{size} B" if size else "the whole cache"
        if self.note:
            return Decision(KIND, (self.name,), False, note=f"{self.note}; each call copies {copy}")
        return Decision(KIND, (self.name,), True, benefit=size,
                        note="rows written in place: 0 cache bytes copied per call")

    def lowered(self, bb: relax.BlockBuilder) -> relax.Call:
        cache, rows = self.cache, self.rows
        axis = int(self.call.attrs.axis) % int(cache.ty.ndim)
        start = self.call.args[2]
        kernel = cache_write_kernel(list(cache.ty.shape.values), list(rows.ty.shape.values), axis,
                                    str(cache.ty.dtype))
        emit = cache_write_emit(cache.ty, rows.ty, axis)
        kernel = kernel.with_attr(EMIT_ATTR, emit.to_attr()).with_attr("aicf.kind", KIND)
        gv = bb.add_func(kernel, KIND)
        # ``start`` goes as a scalar argument (the kernel's last parameter)
        return relax.call_tir_inplace(gv, relax.Tuple([cache, rows, start]), [0], cache.ty)


@tvm.transform.module_pass(opt_level=0, name="CacheInPlace")
class CacheInPlace(EmitRewrite):
    """Write ``slice_scatter`` Emits on donated parameters in place (module docstring)."""

    def rewrite_block(self, bb: relax.BlockBuilder, graph: EmitGraph,
                      facts: FactTable) -> relax.DataflowBlock | None:
        writes = [n for n in graph.nodes if n.emit is not None and n.emit.op == "relax.slice_scatter"]
        if not writes:
            return None
        donated = donated_inputs(self.func)
        accepted = {}
        for node in writes:
            write = _Write(graph, node, self.func, donated)
            self.report.add(write.decision())
            if not write.note:
                accepted[node.index] = write
        if not accepted:
            return None
        bindings = [relax.VarBinding(b.var, accepted[k].lowered(bb)) if k in accepted else b
                    for k, b in enumerate(graph.block.bindings)]
        return relax.DataflowBlock(bindings)


__all__ = ["CacheInPlace", "donated_inputs"]
