"""ChannelsFirst: a channels-last island between two permutes becomes NCHW ops.

ConvNeXt's blocks (and other models written channels-last around an NCHW convolution)
run ``permute(x, NCHW -> NHWC)``, a LayerNorm over the last axis, ``Linear`` layers on
``[N*H*W, C]`` rows with their bias, activation and per-channel scale, then
``permute(.., NHWC -> NCHW)``. Each of those ops has an NCHW twin computing the same
values at permuted indices:

* ``layer_norm(axes=[-1])`` on NHWC  ->  ``layer_norm(axes=[1])`` on NCHW;
* ``matmul(v, W)`` with a constant ``W [C, D]``  ->  the 1x1 ``conv2d`` with weight
  ``Wᵀ [D, C, 1, 1]`` (the same products summed over the same channels);
* pointwise ops: the same op, a per-channel constant ``[C]`` read as ``[1, C, 1, 1]``;
* reshapes between ``[N, H, W, C]`` and ``[N*H*W, C]``: nothing (the NCHW tensor stays 4-D);
* the closing ``permute(.., NHWC -> NCHW)``: the NCHW twin itself.

An island is rewritten only when it is closed: every use of its values is one of those
ops or a closing permute (otherwise the channels-last values would still be needed and
both would be computed), and when it holds a Linear or a LayerNorm (the ops that gain;
a bare permute pair is EliminateEmits' and fusion's business). The NCHW form then joins
the convolution chain around it, which
``MaterializeEmits`` can block (NCHW16c) with no conversion at all; that is why the
pipeline runs this pass only when blocked layouts are available. Runs on op-level Relax,
before LiftEmits.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

from aicf_tvm.core.kinds.registry import BROADCAST, ELEMENTWISE, rule_for

_TO_NHWC, _TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)


def _axes(call: relax.Call) -> tuple[int, ...] | None:
    axes = call.attrs.axes
    return None if axes is None else tuple(int(a) for a in axes)


def _dims(expr: relax.Expr) -> tuple[int, ...] | None:
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is None or str(ty.dtype) != "float32":
        return None
    values = ty.shape.values
    return tuple(int(d) for d in values) if all(isinstance(d, tvm.tirx.IntImm) for d in values) else None


def _is_op(value: relax.Expr, name: str) -> bool:
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == name


def names_an_axis(call: relax.Call) -> bool:
    """A pointwise op with an axis attr (prelu's channel axis): its meaning moves with the
    layout, so it has no layout-free twin."""
    attrs = call.attrs
    return attrs is not None and any(hasattr(attrs, a) for a in ("axis", "axes"))


def _per_channel(arg: relax.Expr, channels: int) -> bool:
    dims = _dims(arg)
    return isinstance(arg, tvm.ir.Constant) and dims is not None and len(dims) <= 4 and \
        (dims[-1:] == (channels,) or not dims) and all(d == 1 for d in dims[:-1])


class _Island:
    """The channels-last values seen so far: var -> (N, H, W) of the island it is in."""

    def __init__(self) -> None:
        self.nhw: dict[relax.Var, tuple[int, int, int]] = {}
        self.parent: dict[relax.Var, relax.Var] = {}

    def root(self, v: relax.Var) -> relax.Var:
        while self.parent[v] is not v:
            v = self.parent[v]
        return v

    def add(self, var: relax.Var, nhw: tuple, linked: list[relax.Var]) -> None:
        self.nhw[var] = nhw
        self.parent[var] = var
        for other in linked:
            self.parent[self.root(other)] = self.root(var)

    def channels_last(self, var: relax.Expr, dims: tuple | None) -> bool:
        """``var`` is an island value whose dims are [N, H, W, C] or [N*H*W, C]."""
        if var not in self.nhw or dims is None:
            return False
        n, h, w = self.nhw[var]
        return dims[:-1] in ((n, h, w), (n * h * w,))


def _member(isl: _Island, var: relax.Var, value: relax.Expr) -> list[relax.Var] | None:
    """The island values ``value`` reads when its binding joins the island, else None."""
    if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
        return None
    out, name = _dims(var), value.op.name
    if out is None:
        return None
    tensors = [a for a in value.args if isinstance(getattr(a, "ty", None), relax.TensorType)]
    inside = [a for a in tensors if a in isl.nhw]
    if not inside or not all(isl.channels_last(a, _dims(a)) for a in inside):
        return None
    channels = out[-1]
    if name == "relax.reshape":
        return inside if isl.channels_last(inside[0], out) and _dims(inside[0])[-1] == channels else None
    if name == "relax.nn.layer_norm":
        axes = [int(a) % len(out) for a in value.attrs.axes]
        ok = axes == [len(out) - 1] and all(_dims(a) == (channels,) for a in value.args[1:])
        return inside if ok and value.args[0] in isl.nhw else None
    if name == "relax.matmul":
        weight = value.args[1]
        ok = value.args[0] in isl.nhw and isinstance(weight, tvm.ir.Constant) and len(_dims(weight) or ()) == 2
        return inside if ok and len(out) == 2 else None
    if rule_for(name).category in (ELEMENTWISE, BROADCAST) and not names_an_axis(value):
        others = [a for a in tensors if a not in isl.nhw]
        same = all(_dims(a) == out for a in inside)
        return inside if same and all(_per_channel(a, channels) for a in others) else None
    return None


def closed_islands(block: relax.DataflowBlock) -> tuple[_Island, set]:
    """The islands of ``block`` and the set of their roots whose values are used only by
    island ops and closing permutes."""
    isl = _Island()
    closers: set = set()
    for b in block.bindings:
        v = b.value
        if _is_op(v, "relax.permute_dims") and _axes(v) == _TO_NHWC and _dims(v.args[0]) is not None \
                and len(_dims(v.args[0])) == 4 and not isinstance(v.args[0], tvm.ir.Constant):
            n, _, h, w = _dims(v.args[0])
            isl.add(b.var, (n, h, w), [])
            continue
        if _is_op(v, "relax.permute_dims") and _axes(v) == _TO_NCHW and v.args[0] in isl.nhw \
                and len(_dims(v.args[0]) or ()) == 4:
            closers.add(b.var)
            continue
        inside = _member(isl, b.var, v)
        if inside is not None:
            isl.add(b.var, isl.nhw[inside[0]], inside)
    closed = {isl.root(v) for v in isl.nhw}
    for b in block.bindings:
        users = set(relax.analysis.free_vars(b.value)) & set(isl.nhw)
        if b.var not in isl.nhw and b.var not in closers:
            closed -= {isl.root(u) for u in users}
    for v in isl.nhw:
        if not isinstance(v, relax.DataflowVar):  # a block output: needed channels-last
            closed.discard(isl.root(v))
    gains = {isl.root(b.var) for b in block.bindings if b.var in isl.nhw and (
        _is_op(b.value, "relax.matmul") or _is_op(b.value, "relax.nn.layer_norm"))}
    return isl, closed & gains


def _nchw_call(value: relax.Call, args: list, channels: int) -> relax.Call | None:
    """The NCHW twin of an island op on NCHW ``args`` (None: a reshape, no op at all)."""
    name = value.op.name
    if name == "relax.reshape":
        return None
    if name == "relax.nn.layer_norm":
        a = value.attrs
        return relax.op.nn.layer_norm(args[0], args[1], args[2], axes=[1], epsilon=a.epsilon, center=a.center,
                                      scale=a.scale)
    if name == "relax.matmul":
        weight = value.args[1].value.numpy()
        kernel = np.ascontiguousarray(weight.T.reshape(weight.shape[1], weight.shape[0], 1, 1))
        return relax.op.nn.conv2d(args[0], relax.const(kernel, str(kernel.dtype)))  # float64 stays float64
    fixed = [relax.const(a.value.numpy().reshape(1, channels, 1, 1), str(a.ty.dtype)) if isinstance(a, tvm.ir.Constant)
             and _dims(a) and _dims(a)[-1] == channels and channels > 1 else a for a in args]
    return relax.Call(value.op, fixed, value.attrs, value.ty_args)


def rewrite_block(bb: relax.BlockBuilder, block: relax.DataflowBlock) -> relax.DataflowBlock | None:
    isl, closed = closed_islands(block)
    if not closed:
        return None
    twin: dict[Any, Any] = {}  # channels-last var -> its NCHW twin
    out = []
    for b in block.bindings:
        v = b.value
        if b.var in isl.nhw and isl.root(b.var) in closed:
            if _is_op(v, "relax.permute_dims"):
                twin[b.var] = v.args[0]
                continue
            args = [twin.get(a, a) for a in v.args]
            call = _nchw_call(v, args, _dims(b.var)[-1])
            if call is None:
                twin[b.var] = args[0]
                continue
            var = relax.DataflowVar(f"{b.var.name}_nchw", bb.normalize(call).ty)
            out.append(relax.VarBinding(var, bb.normalize(call)))
            twin[b.var] = var
        elif _is_op(v, "relax.permute_dims") and v.args[0] in twin:
            out.append(relax.VarBinding(b.var, twin[v.args[0]]))
        else:
            out.append(b)
    return relax.DataflowBlock(out)


@tvm.transform.module_pass(opt_level=0, name="ChannelsFirst")
class ChannelsFirst:
    """Rewrite closed channels-last islands of ``main`` (with a Linear or a LayerNorm)
    into NCHW ops."""

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
            return mod
        func = mod["main"]
        bb = relax.BlockBuilder(mod)
        blocks, changed = [], False
        for block in func.body.blocks:
            new = rewrite_block(bb, block) if isinstance(block, relax.DataflowBlock) else None
            changed |= new is not None
            blocks.append(new or block)
        if not changed:
            return mod
        body = relax.SeqExpr(blocks, func.body.body)
        bb.update_func(mod.get_global_var("main"), relax.Function(func.params, body, func.ret_ty, func.is_pure,
                                                                  func.attrs))
        out = relax.transform.CanonicalizeBindings()(bb.get())
        return relax.transform.DeadCodeElimination()(out)


__all__ = ["ChannelsFirst", "closed_islands"]
