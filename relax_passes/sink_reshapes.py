"""SinkReshapes: move a reshape below the elementwise op that consumes it.

Frontends flatten a ``Linear`` on a 3-D input to 2-D for the matmul and reshape the
result back before the activation (``matmul -> add(bias) -> reshape -> relu``), so the
reshape separates the GEMM from its epilogue and no candidate sees
``relu(add(matmul))``. When the reshape's only use is a pointwise op
(``aicf_tvm.core.kinds.describe.is_pointwise``: an elementwise or broadcast kind with no
attribute naming an axis or layout, so not ``prelu(axis=1)``) whose other operands are
scalars, the op is applied first and the reshape after it:
``relu(reshape(x, s))`` becomes ``reshape(relu(x), s)``; repeated until no reshape moves.

Sound: a pointwise op computes each output element from the input element at the same
index alone, and a reshape keeps the row-major order of the elements, so both orders give the
same values in the same order; a scalar operand (rank 0, or one element of a rank no
larger than the reshaped input) broadcasts the same way in both shapes. Runs on op-level
Relax, before LiftEmits.
"""

from __future__ import annotations

import tvm
from tvm import relax

from aicf_tvm.core.kinds.describe import is_pointwise

from .dataflow_rewrite import rewrite_dataflow_blocks

_RESHAPE = "relax.reshape"


def _is_tensor(expr: relax.Expr) -> bool:
    return isinstance(expr.ty, relax.TensorType)


def _is_scalar_constant(expr: relax.Expr, rank: int) -> bool:
    if not isinstance(expr, tvm.ir.Constant) or not _is_tensor(expr):
        return False
    shape = [int(d) for d in expr.ty.shape]
    size = 1
    for d in shape:
        size *= d
    return size == 1 and len(shape) <= rank


def _sinkable(value: relax.Expr, reshapes: dict, counts: dict) -> relax.VarBinding | None:
    """The reshape binding ``value`` (an op call) may be swapped with, or None."""
    if not is_pointwise(value):
        return None
    tensors = [a for a in value.args if _is_tensor(a) and not isinstance(a, tvm.ir.Constant)]
    if len(tensors) != 1 or tensors[0] not in reshapes or counts.get(tensors[0], 0) != 1:
        return None
    source = reshapes[tensors[0]].value.args[0]
    if not _is_tensor(source) or source.ty.ndim < 0:
        return None
    rank = min(source.ty.ndim, value.ty.ndim)
    for a in value.args:
        if not a.same_as(tensors[0]) and _is_tensor(a) and not _is_scalar_constant(a, rank):
            return None
    return reshapes[tensors[0]]


def _sink_block(bb: relax.BlockBuilder, block: relax.DataflowBlock, counts: dict) -> tuple[relax.DataflowBlock, bool]:
    reshapes = {b.var: b for b in block.bindings
                if isinstance(b.var, relax.DataflowVar) and isinstance(b.value, relax.Call)
                and isinstance(b.value.op, tvm.ir.Op) and b.value.op.name == _RESHAPE}
    swaps = {}
    for b in block.bindings:
        found = _sinkable(b.value, reshapes, counts)
        if found is not None and found.var not in swaps.values():
            swaps[b.var] = found.var
    if not swaps:
        return block, False
    moved = set(swaps.values())
    out = []
    for b in block.bindings:
        if b.var in moved:
            continue
        if b.var not in swaps:
            out.append(b)
            continue
        r = reshapes[swaps[b.var]]
        source, shape = r.value.args
        call = b.value
        args = [source if a.same_as(r.var) else a for a in call.args]
        inner = bb.normalize(relax.Call(call.op, args, call.attrs, call.ty_args))
        t = relax.DataflowVar(f"{b.var.name}_unshaped", inner.ty)
        out.append(relax.VarBinding(t, inner))
        out.append(relax.VarBinding(b.var, bb.normalize(relax.op.reshape(t, shape))))
    return relax.DataflowBlock(out), True


@tvm.transform.module_pass(opt_level=0, name="SinkReshapes")
class SinkReshapes:
    """Swap ``elementwise(reshape(x))`` to ``reshape(elementwise(x))`` in every Relax function."""

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite_dataflow_blocks(mod, _sink_block, to_fixpoint=True)


__all__ = ["SinkReshapes"]
