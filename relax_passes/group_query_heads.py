"""GroupQueryHeads: a grouped-query attention's one-row matmuls run per key/value head.

In grouped-query attention ``G`` query heads share each of ``Hkv`` key/value heads;
frontends repeat k and v to all ``H = Hkv * G`` heads (transformers' ``repeat_kv``:
``expand_dims`` at axis 2, ``broadcast_to [B, Hkv, G, T, D]``, ``reshape [B, H, T, D]``)
and multiply per query head.  With one query row per head (a decode step), each head's
q·kᵀ is a matrix-vector product that reads all of its head's keys for one row, so every
key is read (and, by the attention kernel, packed) ``G`` times.  This pass, on op-level
Relax, rewrites

    scores = matmul(q [.., H, 1, D], kᵀ-chain(repeat_kv(K)) [.., H, D, T])
    context = matmul(p [.., H, 1, T], v-chain(repeat_kv(V)) [.., H, T, D])

to

    scores = reshape(matmul(reshape(q, [.., Hkv, G, D]), kᵀ-chain(K) [.., Hkv, D, T]), [.., H, 1, T])
    context = reshape(matmul(reshape(p, [.., Hkv, G, T]), v-chain(V) [.., Hkv, T, D]), [.., H, 1, D])

so the G query heads of a key/value head are the G rows of one matmul that reads each
key once; ``fused_attention`` takes the new reshapes among its views as before.

The kᵀ chain from ``repeat_kv(K)`` to the matmul may hold views that keep the heads
(``permute_dims`` swapping the last two axes, ``broadcast_to`` its own shape, reshapes
folding the batch into the heads) and one multiply by a scalar constant (SDPA's √scale);
it is rebuilt on ``K``: the permutation, the multiply, the fold.  The v chain may hold
the views alone.

Sound: a reshape between row-major shapes only renames elements: row ``g`` of group
``h`` of the new q is query head ``h * G + g`` (``repeat_kv``'s order), and each score
``scores[h * G + g, 0, t] = sum_d q[h * G + g, 0, d] * s * K[h, t, d]`` is computed from
the same operands in the same order (``d`` ascending); the multiply by the scale is one
IEEE multiply per element, of the same operands, whether before or after the repeat (a
broadcast only copies).  Likewise each context element.  Tests compare both builds bit
for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax

from aicf_tvm.core.tvm_values import static_shape

from .dataflow_rewrite import rewrite_and_drop_dead, splice_block

Block = relax.DataflowBlock


def _op(value: relax.Expr) -> str:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    return ""


@dataclass(frozen=True)
class _Repeat:
    source: relax.Expr  # K or V: [B, Hkv, T, D]
    batch: int
    kv_heads: int
    group: int


def _dims(expr: relax.Expr) -> list | None:
    """The dims of ``expr``'s tensor type: ints, or PrimExprs where symbolic."""
    shape = getattr(expr.ty, "shape", None)
    return _dims_of_shape(shape) if isinstance(shape, relax.ShapeExpr) else None


def _dims_of_shape(shape: relax.ShapeExpr) -> list:
    return [int(d.value) if isinstance(d, tvm.tirx.IntImm) else d for d in shape.values]


def _same(a, b) -> bool:
    """Two dims are one: equal ints, or the same symbolic expression."""
    if isinstance(a, int) or isinstance(b, int):
        return isinstance(a, int) and isinstance(b, int) and a == b
    return tvm_ffi.structural_equal(a, b)


def _all_same(xs: list, ys: list) -> bool:
    return len(xs) == len(ys) and all(_same(x, y) for x, y in zip(xs, ys))


def _repeat_kv(var: relax.Expr, defs: dict) -> _Repeat | None:
    """``var = reshape(broadcast_to(expand_dims(K, [2]), [B, Hkv, G, T, D]), [B, Hkv * G, T, D])``."""
    reshape = defs.get(var)
    if reshape is None or _op(reshape) != "relax.reshape":
        return None
    broadcast = defs.get(reshape.args[0])
    if broadcast is None or _op(broadcast) != "relax.broadcast_to":
        return None
    expand = defs.get(broadcast.args[0])
    if expand is None or _op(expand) != "relax.expand_dims" or [int(a) for a in expand.attrs.axis] != [2]:
        return None
    source = expand.args[0]
    src, wide, out = _dims(source), _dims(reshape.args[0]), _dims(var)
    if src is None or wide is None or out is None or len(src) != 4 or len(wide) != 5 or len(out) != 4:
        return None
    b, hkv, t, d = src
    group = wide[2]
    if not (isinstance(b, int) and isinstance(hkv, int) and isinstance(group, int)) or group < 2:
        return None
    if not _all_same(wide, [b, hkv, group, t, d]) or not _all_same(out, [b, hkv * group, t, d]):
        return None
    return _Repeat(source, b, hkv, group)


@dataclass
class _Chain:
    repeat: _Repeat
    transposed: relax.Expr | None = None  # the permute_dims' operand, when the chain has one
    scale: relax.Call | None = None  # the multiply by a scalar constant, as written


def _chain(var: relax.Expr, defs: dict, keys: bool) -> _Chain | None:
    """Walk from a matmul operand back to ``repeat_kv``: views that keep the heads and, for
    the keys, the one transposition and at most one scalar-constant multiply."""
    transposed, scale = None, None
    while True:
        repeat = _repeat_kv(var, defs)
        if repeat is not None:
            return _Chain(repeat, transposed, scale) if keys == (transposed is not None) else None
        value = defs.get(var)
        name = _op(value) if value is not None else ""
        if name == "relax.reshape" or (name == "relax.broadcast_to"
                                       and tvm_ffi.structural_equal(value.args[0].ty, var.ty)):
            var = value.args[0]
        elif name == "relax.permute_dims" and keys and transposed is None and _swaps_last_two(value):
            transposed = var = value.args[0]
        elif name == "relax.multiply" and keys and scale is None and _scalar_constant(value.args[1]):
            scale, var = value, value.args[0]
        elif name == "relax.multiply" and keys and scale is None and _scalar_constant(value.args[0]):
            scale, var = value, value.args[1]
        else:
            return None


def _swaps_last_two(call: relax.Call) -> bool:
    axes = call.attrs.axes
    return axes is not None and [int(a) for a in axes] == [0, 1, 3, 2]


def _scalar_constant(expr: relax.Expr) -> bool:
    return isinstance(expr, tvm.ir.Constant) and static_shape(expr.ty) == ()


def _grouped(dims: list | None, repeat: _Repeat) -> list | None:
    """A one-row-per-head shape ``[B, H, 1, X]`` (or, batch folded, ``[B * H, 1, X]``) as
    ``[B, Hkv, G, X]`` (``[B * Hkv, G, X]``): the same elements in the same row-major
    order. None for any other shape."""
    heads = repeat.kv_heads * repeat.group
    if dims is None or len(dims) not in (3, 4) or not _same(dims[-2], 1):
        return None
    if len(dims) == 4 and _all_same(dims[:2], [repeat.batch, heads]):
        return [repeat.batch, repeat.kv_heads, repeat.group, dims[-1]]
    if len(dims) == 3 and _same(dims[0], repeat.batch * heads):
        return [repeat.batch * repeat.kv_heads, repeat.group, dims[-1]]
    return None


def _operand_shape_holds(chain: _Chain, operand: relax.Expr, rank: int) -> bool:
    """Whether the chain's reshapes leave the repeated tensor's elements where the rebuilt
    operand has them: a reshape keeps the row-major order, so it suffices that the
    transposition sees ``[B, H, T, D]`` and the operand is ``[B, H, X, Y]`` or, folded,
    ``[B * H, X, Y]`` (``X, Y`` the last two axes after the transposition, if any)."""
    r = chain.repeat
    b, hkv, t, d = _dims(r.source)
    heads = hkv * r.group
    if chain.transposed is not None and not _all_same(_dims(chain.transposed) or [], [b, heads, t, d]):
        return False
    last = [d, t] if chain.transposed is not None else [t, d]
    want = [b * heads, *last] if rank == 3 else [b, heads, *last]
    return _all_same(_dims(operand) or [], want)


# ops of the row region (between the two matmuls) that act on each row alone: re-emitted on
# the grouped rows as they are (a reduction or softmax only over the last axis)
_ROW_OPS = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum", "relax.minimum",
            "relax.equal", "relax.not_equal", "relax.less", "relax.greater", "relax.less_equal",
            "relax.greater_equal", "relax.where", "relax.astype", "relax.logical_not", "relax.logical_and",
            "relax.logical_or", "relax.exp", "relax.negative", "relax.nn.softmax", "relax.max", "relax.min",
            "relax.sum", "relax.reshape", "relax.broadcast_to"}


@dataclass
class _Attention:
    """One grouped-query attention of a block: its q·kᵀ and p·v matmuls, their chains
    back to ``repeat_kv``, and the bindings between them, in order."""

    qk: relax.VarBinding
    keys: _Chain
    pv: relax.VarBinding
    values: _Chain
    region: list[relax.VarBinding]


def _one_row_matmul(b: relax.VarBinding, defs: dict, keys: bool) -> _Chain | None:
    """The chain of ``b``'s right operand when ``b`` is a matmul of one row per query head
    by repeated keys (``keys``) or values."""
    if _op(b.value) != "relax.matmul":
        return None
    rows, other = b.value.args
    chain = _chain(other, defs, keys)
    if chain is None:
        return None
    grouped = _grouped(_dims(rows), chain.repeat)
    if grouped is None or not _operand_shape_holds(chain, other, len(grouped)):
        return None
    return chain


def _find(block: Block, uses: dict) -> _Attention | None:
    """The first attention whose row region is closed: every value computed from q·kᵀ is
    read only by the region or by p·v's left operand, and is one row per head."""
    defs = {b.var: b.value for b in block.bindings}
    bindings = list(block.bindings)
    for at, qk in enumerate(bindings):
        keys = _one_row_matmul(qk, defs, keys=True)
        if keys is None:
            continue
        inside, region, pv, values = {qk.var}, [], None, None
        reads: dict = {}
        for b in bindings[at + 1:]:
            args = [a for a in getattr(b.value, "args", []) if isinstance(a, relax.Var)]
            if not any(a in inside for a in args):
                continue
            for a in args:
                reads[a] = reads.get(a, 0) + 1
            chain = _one_row_matmul(b, defs, keys=False)
            if chain is not None and b.value.args[0] in inside and b.value.args[1] not in inside:
                if pv is not None:
                    return None
                pv, values = b, chain
            elif pv is None and _op(b.value) in _ROW_OPS and _grouped(_dims(b.var), keys.repeat) is not None:
                inside.add(b.var)
                region.append(b)
            else:
                break  # a value from q·kᵀ reaches an op that is not row-wise
        else:
            if pv is None or values.repeat.group != keys.repeat.group or any(
                    reads.get(v, 0) != uses.get(v, 0) for v in inside):
                continue
            return _Attention(qk, keys, pv, values, region)
    return None


def _broadcasts_over_rows(expr: relax.Expr, rank: int) -> bool:
    """Whether an operand from outside the region is the same for every head and row: a
    scalar, or a tensor (right-aligned with the region's rank) of extent 1 on the head
    and row axes (a mask over the keys)."""
    own = _dims(expr)
    if own is None:
        return False
    own = [1] * (rank - len(own)) + own
    head_axis = 0 if rank == 3 else 1
    return len(own) == rank and _same(own[head_axis], 1) and _same(own[head_axis + 1], 1)


def _regroup(bb: relax.BlockBuilder, att: _Attention) -> list[relax.VarBinding] | None:
    """The bindings that compute the attention per key/value head, or None when a row op
    does not take the grouped shapes."""
    out: list[relax.VarBinding] = []
    grouped: dict = {}  # a region var -> its grouped twin

    def emit(expr: relax.Expr, name: str) -> relax.Var:
        expr = bb.normalize(expr)
        var = relax.DataflowVar(name, expr.ty)
        out.append(relax.VarBinding(var, expr))
        return var

    def matmul(b: relax.VarBinding, chain: _Chain, rows: relax.Expr, tag: str) -> relax.Var:
        r, x = chain.repeat, chain.repeat.source  # [B, Hkv, T, D]
        rank = len(_dims(b.value.args[0]))
        if chain.transposed is not None:
            x = emit(relax.op.permute_dims(x, [0, 1, 3, 2]), f"{tag}_t")
        if chain.scale is not None:  # the constant on the side the graph has it
            a, c = chain.scale.args
            x = emit(relax.op.multiply(x, c) if _scalar_constant(c) else relax.op.multiply(a, x), f"{tag}_scaled")
        if rank == 3:
            x = emit(relax.op.reshape(x, [r.batch * r.kv_heads, *_dims(x)[2:]]), f"{tag}_folded")
        return emit(relax.op.matmul(rows, x, out_dtype=b.value.attrs.out_dtype), f"{tag}_grouped")

    repeat = att.keys.repeat
    qk = att.qk
    q = emit(relax.op.reshape(qk.value.args[0], _grouped(_dims(qk.value.args[0]), repeat)), f"{qk.var.name}_rows")
    grouped[qk.var] = matmul(qk, att.keys, q, qk.var.name)
    for b in att.region:
        value, rank = b.value, len(_dims(b.var))
        args = []
        for a in value.args:
            if a in grouped:
                args.append(grouped[a])
            elif isinstance(a, relax.ShapeExpr):
                args.append(relax.ShapeExpr(_grouped(_dims_of_shape(a), repeat)))
            elif hasattr(a, "ty") and _broadcasts_over_rows(a, rank):
                args.append(a)
            else:
                return None
        if _op(value) in ("relax.nn.softmax", "relax.max", "relax.min", "relax.sum") and not _last_axis(value, rank):
            return None
        if _op(value) == "relax.broadcast_to" and not tvm_ffi.structural_equal(value.args[0].ty, b.var.ty):
            return None
        if len(value.ty_args):
            return None
        new = emit(relax.Call(value.op, args, value.attrs), f"{b.var.name}_grouped")
        if not _all_same(_dims(new) or [], _grouped(_dims(b.var), repeat)):
            return None
        grouped[b.var] = new
    pv = att.pv
    context = matmul(pv, att.values, grouped[pv.value.args[0]], pv.var.name)
    out.append(relax.VarBinding(pv.var, bb.normalize(relax.op.reshape(context, _dims(pv.var)))))
    return out


def _last_axis(call: relax.Call, rank: int) -> bool:
    """A softmax or reduction over the last axis alone, its dims kept."""
    axis = call.attrs.axis
    axes = [int(axis)] if isinstance(axis, (int, tvm.tirx.IntImm)) else [int(a) for a in axis or []]
    keeps = getattr(call.attrs, "keepdims", True)
    return len(axes) == 1 and axes[0] % rank == rank - 1 and bool(keeps)


def _rewrite_block(bb: relax.BlockBuilder, block: Block, uses: dict) -> tuple[Block, bool]:
    att = _find(block, uses)
    new = _regroup(bb, att) if att is not None else None
    if new is None:
        return block, False
    replace = {b.var: [] for b in (att.qk, *att.region)}
    replace[att.pv.var] = new
    return splice_block(block, replace), True


@tvm.transform.module_pass(opt_level=0, name="GroupQueryHeads")
class GroupQueryHeads:
    """One-row grouped-query matmuls per key/value head (module docstring)."""

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite_and_drop_dead(mod, _rewrite_block, to_fixpoint=True)  # each attention in turn


__all__ = ["GroupQueryHeads"]
