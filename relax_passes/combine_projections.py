"""CombineProjections: projections of one input by constant weights become one GEMM.

Attention projects one hidden state three times (``q = x Wq + bq``, ``k = x Wk + bk``,
``v = x Wv + bv``); each is a GEMM of a few hundred rows and fewer columns than the
cores can share evenly.  This pass, on op-level Relax after the weights are constants,
rewrites each such group to

    y = matmul(x, concat(W_1, ..., W_n, axis=-1)) [+ concat(b_1, ..., b_n)]
    p_i = strided_slice(y, axis=-1, begin=N_1 + ... + N_(i-1), end=N_1 + ... + N_i)

and ``fused_attention`` takes the slices among its view ops (its q/k/v copies index the
wide output), so no kernel copies them out.  A ``split`` read only through
``TupleGetItem`` (GPT-2's fused ``c_attn``) becomes such slices too.

A group: ``matmul(x_i, W_i)`` bindings in one dataflow block whose left operands are one
value (the same variable, or reshapes of one variable to one shape: frontends flatten the
input once per ``Linear``), whose ``W_i`` are rank-2 constants of one dtype with one ``K``
and whose calls have one ``out_dtype``, and each of whose results reaches a
``permute_dims`` or a ``matmul`` through views alone (``_head_split``): a gated MLP's gate
and up stay apart, their ``silu(gate) * up`` is the GEMMs' fused epilogue.  A branch takes
its bias along when the matmul's only use is ``add`` with a constant of shape ``[N_i]``; a
branch without one (BEiT's k)
gets ``-0.0``, the exact identity of IEEE addition (``x + (-0.0)`` is ``x`` for every
``x``, ``-0.0`` and NaN included; ``+0.0`` would turn ``-0.0`` into ``+0.0``).  The
combined weight is new; the old constants stay where other bindings still use them.

Sound: column ``j`` of a GEMM is the dot product of a row of x with column ``j`` of W, and
neither depends on the other columns: ``y[..., N_1 + j]`` is computed from exactly the
operands of ``p_2[..., j]``, in the same reduction order (our GEMM schedules accumulate
each column over K in ascending order whatever the tile), and the bias add is one IEEE
addition per element either way (addition commutes exactly, so ``add(b, m)`` and
``add(m, b)`` agree).  A slice only moves elements.  Tests compare the combined build's
outputs with the uncombined one bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from aicf_tvm.core.tvm_values import static_shape

from .dataflow_rewrite import operand_key, rewrite_and_drop_dead, splice_block

_MATMUL, _ADD, _RESHAPE = "relax.matmul", "relax.add", "relax.reshape"
Block = relax.DataflowBlock
VIEW_OPS = ("relax.reshape", "relax.strided_slice", "relax.squeeze", "relax.expand_dims")


def _op_name(value: relax.Expr) -> str:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    return ""


@dataclass
class _Branch:
    matmul: relax.VarBinding
    bias: relax.VarBinding | None  # the add of a bias constant, the matmul's only use
    weight: np.ndarray
    bias_value: np.ndarray | None

    @property
    def out(self) -> relax.Var:
        return (self.bias or self.matmul).var


def _bias_of(binding: relax.VarBinding, matmul: relax.Var, n: int) -> np.ndarray | None:
    """The ``[n]`` bias constant ``binding`` adds to ``matmul``, or None."""
    if _op_name(binding.value) != _ADD:
        return None
    a, b = binding.value.args
    other = b if a.same_as(matmul) else a if b.same_as(matmul) else None
    if not isinstance(other, tvm.ir.Constant) or static_shape(other.ty) != (n,):
        return None
    if str(other.ty.dtype) != str(matmul.ty.dtype):
        return None
    return other.value.numpy()


def _head_split(var: relax.Var, consumers: dict, uses: dict) -> bool:
    """Whether every use of ``var`` is a chain of view ops in its block that reaches a
    ``permute_dims`` or a ``matmul`` before anything computes: attention's head split.  A
    consumer that computes first, like a gated MLP's ``silu(gate) * up``, would be the
    GEMM's fused epilogue: that GEMM stays whole."""
    users = consumers.get(var, [])
    if not isinstance(var, relax.DataflowVar) or not users or len(users) != uses.get(var, 0):
        return False
    for user in users:
        name = _op_name(user.value)
        if name in ("relax.permute_dims", _MATMUL):
            continue
        if name not in VIEW_OPS or not _head_split(user.var, consumers, uses):
            return False
    return True


def _groups(block: relax.DataflowBlock, uses: dict) -> list[list[_Branch]]:
    reshapes = {b.var: b for b in block.bindings if _op_name(b.value) == _RESHAPE}
    consumers: dict = {}
    for b in block.bindings:
        for arg in getattr(b.value, "args", []):
            if isinstance(arg, relax.Var):
                consumers.setdefault(arg, []).append(b)
    found: dict = {}
    for b in block.bindings:
        if _op_name(b.value) != _MATMUL:
            continue
        lhs, rhs = b.value.args
        w_shape = static_shape(rhs.ty) if isinstance(rhs, tvm.ir.Constant) else None
        # the rows may be symbolic (a prompt of any length): each column is its own dot product
        if w_shape is None or len(w_shape) != 2 or getattr(lhs.ty, "ndim", -1) < 2:
            continue
        dtype = str(rhs.ty.dtype)
        if not dtype.startswith("float") or str(lhs.ty.dtype) != dtype or str(b.var.ty.dtype) != dtype:
            continue
        bias, bias_value = None, None
        users = consumers.get(b.var, [])
        if uses.get(b.var, 0) == 1 and len(users) == 1:
            bias_value = _bias_of(users[0], b.var, w_shape[1])
            bias = users[0] if bias_value is not None else None
        out = bias.var if bias is not None else b.var
        if not _head_split(out, consumers, uses):
            continue
        key = (operand_key(lhs, reshapes), w_shape[0], dtype, str(b.value.attrs.out_dtype))
        found.setdefault(key, []).append(_Branch(b, bias, rhs.value.numpy(), bias_value))
    return [branches for branches in found.values() if len(branches) > 1]


def _slice_splits(bb: relax.BlockBuilder, block: relax.DataflowBlock, uses: dict) -> tuple[Block, bool]:
    """Each ``split`` whose tuple is only read by ``TupleGetItem`` becomes one
    ``strided_slice`` per item (a view that a consumer fuses; the split is a kernel)."""
    splits = {b.var: b for b in block.bindings if _op_name(b.value) == "relax.split"}
    items: dict = {}
    for b in block.bindings:
        if isinstance(b.value, relax.TupleGetItem) and b.value.tuple_value in splits:
            items.setdefault(b.value.tuple_value, []).append(b)
    sliced: dict = {}
    for var, split in splits.items():
        x = split.value.args[0]
        shape = static_shape(x.ty)
        reads = items.get(var, [])
        if shape is None or not reads or len(reads) != uses.get(var, 0):
            continue
        axis = int(split.value.attrs.axis) % len(shape)
        sections = split.value.attrs.indices_or_sections
        if isinstance(sections, (int, tvm.tirx.IntImm)):
            if shape[axis] % int(sections):
                continue
            width = shape[axis] // int(sections)
            bounds = [width * i for i in range(int(sections) + 1)]
        else:
            bounds = [0, *(int(i) for i in sections), shape[axis]]
        for b in reads:
            index = int(b.value.index)
            view = relax.op.strided_slice(x, axes=[axis], begin=[bounds[index]], end=[bounds[index + 1]])
            sliced[b.var] = relax.VarBinding(b.var, bb.normalize(view))
        sliced[var] = None
    if not sliced:
        return block, False
    out = [sliced.get(b.var, b) for b in block.bindings]
    return relax.DataflowBlock([b for b in out if b is not None]), True


def _combine(bb: relax.BlockBuilder, block: relax.DataflowBlock, uses: dict) -> tuple[Block, bool]:
    groups = _groups(block, uses)
    if not groups:
        return block, False
    first: dict = {}  # binding var of a group's first matmul -> the new bindings
    replaced: dict = {}  # a branch's output var -> its new binding
    dropped: set = set()
    for branches in groups:
        lead = branches[0].matmul
        weight = np.concatenate([br.weight for br in branches], axis=-1)
        weight = relax.const(weight, str(weight.dtype))  # relax.const makes float64 float32
        y = bb.normalize(relax.op.matmul(lead.value.args[0], weight, out_dtype=lead.value.attrs.out_dtype))
        y_var = relax.DataflowVar(f"{lead.var.name}_combined", y.ty)
        new = [relax.VarBinding(y_var, y)]
        if any(br.bias is not None for br in branches):
            # -0.0 where a branch has no bias: x + (-0.0) is x for every float, -0.0 and NaN included
            bias = np.concatenate([
                br.bias_value if br.bias is not None else np.full(br.weight.shape[1], -0.0, br.weight.dtype)
                for br in branches])
            bias = relax.const(bias, str(bias.dtype))
            added = bb.normalize(relax.op.add(y_var, bias))
            y_var = relax.DataflowVar(f"{lead.var.name}_combined_bias", added.ty)
            new.append(relax.VarBinding(y_var, added))
        start, axis = 0, y_var.ty.ndim - 1
        first[lead.var] = new
        for br in branches:
            width = br.weight.shape[1]
            piece = relax.op.strided_slice(y_var, axes=[axis], begin=[start], end=[start + width])
            piece = bb.normalize(piece)
            replaced[br.out] = relax.VarBinding(br.out, piece)
            start += width
            if br.bias is not None:
                dropped.add(br.matmul.var)
    replace = {var: [] for var in dropped}
    replace.update({var: [binding] for var, binding in replaced.items()})
    return splice_block(block, replace, before=first), True


@tvm.transform.module_pass(opt_level=0, name="CombineProjections")
class CombineProjections:
    """Merge the head-split GEMMs of one input into one GEMM read through slices."""

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite_and_drop_dead(mod, _rewrite_block)  # the branches' own reshapes of x


def _rewrite_block(bb: relax.BlockBuilder, block: relax.DataflowBlock, uses: dict) -> tuple[Block, bool]:
    block, sliced = _slice_splits(bb, block, uses)
    block, combined = _combine(bb, block, uses)
    return block, sliced or combined


__all__ = ["CombineProjections"]
