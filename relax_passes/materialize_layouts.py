"""The layout step of MaterializeEmits: blocked channel layouts (``NCHW{b}c``) for chains of
convolutions, chosen by cost, converted at the chains' boundaries only (docs/design.md §6).

A *chain* is a connected set of single-op Emits that all have a blocked form
(``layout_form``): NCHW convolutions with a constant weight (dense, depthwise, grouped
with both group widths multiples of the blocks, or dense on a plain input whose channels
do not block, as a network's first convolution), elementwise and broadcast ops on
activations of one shape (bias, activation, residual add) or of one shape and its
``[N, C, 1, 1]`` (a squeeze-and-excitation scale), NCHW pools, spatial reductions
that keep their dims (the global average pool) and LayerNorms over the channels (over
``(C/b, b)`` blocked), and concatenations along the channels whose parts all take the
output's block (then whole blocks are concatenated), linked by the activations they
pass, at least one of them a convolution. Every
activation of a chain has a static shape and channels the block divides; its block is
the vector width when that divides the channels, else half of it.

Per chain, the cost model compares the convolutions' time in NCHW (im2col + GEMM) with
their time blocked (direct convolution), from ``RATES``, against the time to convert the
activations that cross the boundary (``CONVERT_BYTES_PER_S``). When the saving is larger,
every member is rewritten to its blocked form, each activation entering the chain gets one
blocking ``layout_transform`` Emit and each value leaving it one unblocking Emit, bound to
the original variable so consumers outside are unchanged. Constants are converted now:
weights to ``OIHW{i}i{o}o`` (a grouped one's I is a group's input channels, as in OIHW,
so it packs as a dense one), per-channel operands to ``[1, C/b, 1, 1, b]``. Every chain,
taken or not, is in the report with both times and the bytes converted.

Sound: a blocked op reads channel ``c`` at ``[.., c // b, .., c % b]`` of operands stored
exactly so, so it computes the same values as the NCHW op (the same sums of the same
products; pointwise ops are per element; a grouped convolution's blocks never straddle
two groups); the transforms are bijections (``b`` divides
the channels: no padding) and their inverses at the exits restore the NCHW values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax

from aicf_tvm.core.emit_graph import EmitGraph
from aicf_tvm.core.kinds.layouts import blocked, blocking_map, unblocking_map
from aicf_tvm.core.kinds.registry import BROADCAST, ELEMENTWISE, kind_name, rule_for
from aicf_tvm.core.report import Decision, FusionReport
from aicf_tvm.core.tvm_values import static_shape

from .channels_first import names_an_axis
from .fusion_planner import op_view
from .legalize_blocked_conv import is_vnni_form
from .lift_emits import build_emit_function

# GFLOP/s of one core for the default CPU rules, float32: medians over ResNet-50 and
# MobileNetV2 layers on the AVX-512 host (Conv2d and Depthwise for NCHW, BlockedConv2d
# blocked), as ``scripts/bench_conv_layouts.py`` measures them; "grouped" over RegNetY
# (group width 64) and ResNeXt (width 16) layers, measured later on a loaded host, when the
# dense classes read 65 / 86 and 1x1 53 / 105 (NCHW / blocked) there.
RATES = {
    ("NCHW", "dense"): 51.0, ("NCHW", "1x1"): 39.0, ("NCHW", "depthwise"): 21.0, ("NCHW", "plain_input"): 39.0,
    ("NCHW", "grouped"): 46.0,
    ("blocked", "dense"): 94.0, ("blocked", "1x1"): 100.0, ("blocked", "depthwise"): 39.0,
    ("blocked", "plain_input"): 86.0, ("blocked", "grouped"): 128.0,
    # uint8 x int8 -> int32 (relax_passes.integer_qdq): TVM's NCHW conv of integers has no
    # fast schedule; blocked, AVX-512 VNNI's 4-byte dot products (schedules.cpu.conv2d_int8),
    # 270-400 GMAC/s on ResNet-50 layers on the Emerald Rapids host
    ("NCHW", "int8"): 10.0, ("blocked", "int8"): 600.0,
}
# A layout_transform reads and writes each byte once, and costs a kernel launch (the
# thread pool's fork and join) besides.
CONVERT_BYTES_PER_S = 4e9
CONVERT_SECONDS = 10e-6
_POOLS = {"relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.adaptive_avg_pool2d"}
_SPATIAL_REDUCE = {"relax.mean", "relax.sum", "relax.max"}


def channel_block(channels: int, lanes: int) -> int | None:
    """The block of ``channels``: the vector width, else half of it, when it divides them."""
    for block in (lanes, lanes // 2):
        if block >= 4 and channels % block == 0:
            return block
    return None


def _dims(expr: relax.Expr) -> tuple[int, ...] | None:
    ty = getattr(expr, "ty", None)
    return static_shape(ty) if isinstance(ty, relax.TensorType) else None


# dtypes of the activations a chain passes: float32, and a QDQ model's integers and requantization
_ACTIVATION_DTYPES = ("float32", "float64", "uint8", "int8", "int32")


def _static_4d(expr: relax.Expr) -> tuple[int, ...] | None:
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.ndim != 4 or ty.shape is None \
            or str(ty.dtype) not in _ACTIVATION_DTYPES:
        return None
    dims = ty.shape.values
    return tuple(int(d) for d in dims) if all(isinstance(d, tvm.tirx.IntImm) for d in dims) else None


@dataclass(frozen=True)
class Form:
    """What a node's blocked form is: ``kind`` (conv class, "pointwise", "pool", "reduce"),
    its GFLOP count (convolutions), and whether it reads its data argument plain."""

    kind: str
    gflop: float = 0.0
    plain_input: bool = False


def _per_channel(arg: relax.Expr, channels: int) -> bool:
    """A constant operand that is one value per channel ([1, C, 1, 1] or [C, 1, 1])."""
    dims = tuple(int(d) for d in arg.ty.shape.values) if arg.ty.shape is not None else None
    return dims in ((1, channels, 1, 1), (channels, 1, 1))


def _per_sample(out: tuple[int, ...]) -> tuple[int, ...]:
    """``[N, C, 1, 1]`` of an ``[N, C, H, W]`` activation: blocked to ``[N, C/b, 1, 1, b]``
    with ``out``'s block, it broadcasts over ``H, W`` as it did in NCHW."""
    return (out[0], out[1], 1, 1)


def _scalar_like(arg: relax.Expr) -> bool:
    dims = arg.ty.shape.values if arg.ty.shape is not None else None
    return dims is not None and all(isinstance(d, tvm.tirx.IntImm) and int(d) == 1 for d in dims)


def layout_form(call: relax.Expr, result: relax.Var, lanes: int) -> Form | None:
    """The blocked form of an op-level call bound to ``result``, None when it has none."""
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
        return None
    out = _static_4d(result)
    if out is None or channel_block(out[1], lanes) is None:
        return None
    name = call.op.name
    if name == "relax.nn.conv2d":
        return _conv_form(call, out, lanes)
    tensors = [a for a in call.args if isinstance(getattr(a, "ty", None), relax.TensorType)]
    if rule_for(name).category in (ELEMENTWISE, BROADCAST):
        if names_an_axis(call):
            return None
        for a in tensors:
            if _static_4d(a) in (out, _per_sample(out)) and not isinstance(a, tvm.ir.Constant):
                continue  # an activation of this shape, or one value per (sample, channel): SE's scale
            if isinstance(a, tvm.ir.Constant) and (_per_channel(a, out[1]) or _scalar_like(a)):
                continue
            return None
        return Form("pointwise") if any(_static_4d(a) == out for a in tensors) else None
    if name == "relax.concat" and int(call.attrs.axis) % 4 == 1 and isinstance(call.args[0], relax.Tuple):
        parts = [_static_4d(f) for f in call.args[0].fields]
        ok = all(p is not None and not isinstance(f, tvm.ir.Constant) and channel_block(p[1], lanes) ==
                 channel_block(out[1], lanes) for p, f in zip(parts, call.args[0].fields))
        return Form("concat") if ok else None  # whole channel blocks, one block size
    data = _static_4d(tensors[0]) if tensors else None
    if data is None or data[1] != out[1]:
        return None
    if name in _POOLS and str(call.attrs.layout) == "NCHW" and str(call.attrs.out_layout) == "NCHW":
        return Form("pool")
    if name in _SPATIAL_REDUCE and bool(call.attrs.keepdims) and call.attrs.axis is not None \
            and sorted(int(a) % 4 for a in call.attrs.axis) == [2, 3]:
        return Form("reduce")
    if name == "relax.nn.layer_norm" and [int(a) % 4 for a in call.attrs.axes] == [1] and all(
            isinstance(a, tvm.ir.Constant) and _dims(a) == (out[1],) for a in call.args[1:]):
        return Form("norm")  # over the channels: over (C/b, b) blocked
    return None


def _conv_form(call: relax.Call, out: tuple, lanes: int) -> Form | None:
    a = call.attrs
    data, weight = call.args
    x = _static_4d(data)
    if x is None or not isinstance(weight, tvm.ir.Constant):
        return None
    if (str(a.data_layout), str(a.kernel_layout), str(a.out_layout)) != ("NCHW", "OIHW", "NCHW"):
        return None
    o, i, kh, kw = (int(d) for d in weight.ty.shape.values)
    gflop = 2.0 * out[0] * o * i * kh * kw * out[2] * out[3] / 1e9
    out_dtype = str(a.out_dtype)
    unset = out_dtype in ("", "void", "None")  # the data's dtype
    dtypes = (str(data.ty.dtype), str(weight.ty.dtype), str(data.ty.dtype) if unset else out_dtype)
    if dtypes == ("uint8", "int8", "int32"):  # the VNNI form of relax_passes.legalize_blocked_conv
        ib, ob = channel_block(x[1], lanes), channel_block(o, lanes)
        ok = int(a.groups) == 1 and ib is not None and is_vnni_form(*dtypes, 1, ib, ob or 0)
        return Form("int8", gflop) if ok else None
    if dtypes != ("float32",) * 3:
        return None
    groups = int(a.groups)
    if groups > 1 and groups == x[1] == o and i == 1:
        return Form("depthwise", gflop) if channel_block(x[1], lanes) == channel_block(o, lanes) else None
    if groups > 1:  # grouped: the blocks must divide both group widths (no block spans two groups)
        ib, ob = channel_block(x[1], lanes), channel_block(o, lanes)
        ok = ib is not None and ob is not None and i % ib == 0 and (o // groups) % ob == 0
        return Form("grouped", gflop) if ok else None
    if channel_block(x[1], lanes) is None:
        return Form("plain_input", gflop, plain_input=True)
    return Form("1x1" if kh == kw == 1 else "dense", gflop)


@dataclass
class Chain:
    members: list[int]
    forms: dict[int, Form]
    entries: list[Any]  # activations entering (blocked once each)
    exits: list[int]  # members whose value is used outside the chain

    def conv_seconds(self, layout: str) -> float:
        return sum(f.gflop / RATES[(layout, f.kind)] for f in self.forms.values() if f.gflop)


def find_chains(graph: EmitGraph, lanes: int) -> list[Chain]:
    """Connected sets of nodes with a blocked form, linked by activations, holding a conv."""
    var2val, _ = op_view(graph)
    forms: dict[int, Form] = {}
    for node in graph.nodes:
        if node.body is not None and not node.is_opaque:
            form = layout_form(var2val.get(node.var), node.var, lanes)
            if form is not None:
                forms[node.index] = form
    parent = {i: i for i in forms}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, form in forms.items():
        for k, arg in _operands(var2val[graph.nodes[i].var]):
            src = graph.node_of(arg)
            if src is not None and src.index in forms and not (form.plain_input and k == 0):
                parent[root(i)] = root(src.index)
    groups: dict[int, list[int]] = {}
    for i in forms:
        groups.setdefault(root(i), []).append(i)
    chains = []
    for members in groups.values():
        members.sort()
        if not any(forms[i].gflop for i in members):
            continue
        inside = set(members)
        entries: list[Any] = []
        for i in members:
            for k, arg in _operands(var2val[graph.nodes[i].var]):
                src = graph.node_of(arg)
                is_act = _static_4d(arg) is not None and not isinstance(arg, tvm.ir.Constant)
                if is_act and (src is None or src.index not in inside) and not (forms[i].plain_input and k == 0):
                    if not any(arg.same_as(e) for e in entries):
                        entries.append(arg)
        exits = [i for i in members if graph.nodes[i].escapes or any(c not in inside for c in graph.nodes[i].consumers)]
        chains.append(Chain(members, {i: forms[i] for i in members}, entries, exits))
    return chains


def _operands(call: relax.Call) -> list[tuple[int, relax.Expr]]:
    """(argument position, expr) of every argument, a tuple's fields (concat's) each."""
    out = []
    for k, arg in enumerate(call.args):
        out.extend((k, f) for f in arg.fields) if isinstance(arg, relax.Tuple) else out.append((k, arg))
    return out


def _nbytes(expr: relax.Expr) -> int:
    return int(np.prod([int(d) for d in expr.ty.shape.values])) * tvm.runtime.DataType(str(expr.ty.dtype)).bits // 8


def judge(chain: Chain, graph: EmitGraph, lanes: int) -> Decision:
    """Block the chain when the table's conv-time saving exceeds the conversions' cost."""
    converted = sum(_nbytes(e) for e in chain.entries) + sum(_nbytes(graph.nodes[i].var) for i in chain.exits)
    plain, fast = chain.conv_seconds("NCHW"), chain.conv_seconds("blocked")
    cost = 2 * converted / CONVERT_BYTES_PER_S + CONVERT_SECONDS * (len(chain.entries) + len(chain.exits))
    blocks = sorted({channel_block(_static_4d(graph.nodes[i].var)[1], lanes) for i in chain.members})
    names = tuple(graph.nodes[i].var.name for i in chain.members)
    convs = sum(1 for f in chain.forms.values() if f.gflop)
    ok = plain - fast > cost
    note = (f"{'/'.join(blocked(b) for b in blocks)} for {len(names)} Emits ({convs} convolutions): conv time "
            f"{plain * 1e3:.3f} ms NCHW -> {fast * 1e3:.3f} ms blocked by the rate table; "
            f"{len(chain.entries)} entering and {len(chain.exits)} leaving activations converted, "
            f"{converted} B, {cost * 1e3:.3f} ms; saving {'>' if ok else '<='} cost")
    return Decision("materialize:layout", names, ok, note=note)


def blocked_weight(weight: np.ndarray, ib: int, ob: int) -> np.ndarray:
    """OIHW -> OIHW{ib}i{ob}o (``ib`` 1 for a plain input or a depthwise kernel)."""
    o, i, kh, kw = weight.shape
    return np.ascontiguousarray(weight.reshape(o // ob, ob, i // ib, ib, kh, kw).transpose(0, 2, 4, 5, 3, 1))


def blocked_per_channel(value: np.ndarray, block: int) -> np.ndarray:
    """[1, C, 1, 1] or [C, 1, 1] -> [1, C/b, 1, 1, b]."""
    channels = value.size
    return np.ascontiguousarray(value.reshape(1, channels // block, 1, 1, block))


class ChainRewriter:
    """Rewrites the members of taken chains; ``bindings`` gives the new block."""

    def __init__(self, bb: relax.BlockBuilder, graph: EmitGraph, lanes: int) -> None:
        self.bb, self.graph, self.lanes = bb, graph, lanes
        self.var2val, _ = op_view(graph)
        self.replace: dict[int, list] = {}  # node index -> the bindings that replace it
        self.blocked: dict[Any, relax.Var] = {}  # NCHW value -> its blocked var

    def _block(self, expr: relax.Expr) -> int:
        return channel_block(_static_4d(expr)[1], self.lanes)

    def _emit(self, call: relax.Call, name: str, var: relax.Var | None = None) -> tuple[relax.Var, relax.VarBinding]:
        """``call`` lifted to an Emit, bound to ``var`` (else a new ``name``)."""
        call = self.bb.normalize(call)
        func, args = build_emit_function(call)
        gv = self.bb.add_func(func, f"emit_{kind_name(call.op.name)}")
        var = var if var is not None else relax.DataflowVar(name, call.ty)
        return var, relax.VarBinding(var, self.bb.normalize(relax.Call(gv, list(args))))

    def rewrite(self, chain: Chain) -> None:
        exits = set(chain.exits)
        for i in chain.members:
            node = self.graph.nodes[i]
            out: list = []
            call = self.var2val[node.var]
            args = []
            for k, arg in enumerate(call.args):
                if chain.forms[i].plain_input and k == 0:
                    args.append(arg)
                elif isinstance(arg, relax.Tuple):
                    args.append(relax.Tuple([self._operand(f, chain, out) for f in arg.fields]))
                else:
                    args.append(self._blocked_arg(self._operand(arg, chain, out), call, node.var, k, chain.forms[i]))
            blocked_call = self._blocked_call(call, node.var, args, chain.forms[i])
            var, binding = self._emit(blocked_call, f"{node.var.name}_blocked")
            out.append(binding)
            self.blocked[node.var] = var
            if i in exits:  # the NCHW value, under its own name, for the consumers outside
                block = self._block(node.var)
                out.append(self._emit(relax.op.layout_transform(var, index_map=unblocking_map(block)),
                                      "layout_transform", node.var)[1])
            self.replace[i] = out

    def _operand(self, arg: relax.Expr, chain: Chain, out: list[relax.VarBinding]) -> relax.Expr:
        """A chain activation's blocked var; an entering one blocked now (once)."""
        if arg not in self.blocked and any(arg.same_as(e) for e in chain.entries):
            var, binding = self._emit(relax.op.layout_transform(arg, index_map=blocking_map(self._block(arg))),
                                      f"{getattr(arg, 'name', 'x')}_blocked")
            out.append(binding)
            self.blocked[arg] = var
        return self.blocked.get(arg, arg)

    def _blocked_arg(self, arg: relax.Expr, call: relax.Call, result: relax.Var, k: int, form: Form) -> relax.Expr:
        if arg in self.blocked:
            return self.blocked[arg]
        if not isinstance(arg, tvm.ir.Constant) or not isinstance(arg.ty, relax.TensorType):
            return arg
        value = arg.value.numpy()
        dtype = str(arg.ty.dtype)  # relax.const would make a float64 array float32
        out_block = self._block(result)
        if call.op.name == "relax.nn.conv2d" and k == 1:
            ib = 1 if form.kind in ("depthwise", "plain_input") else self._block(call.args[0])
            return relax.const(blocked_weight(value, ib, out_block), dtype)
        if call.op.name == "relax.nn.layer_norm":  # gamma, beta [C] -> [C/b, b]
            return relax.const(np.ascontiguousarray(value.reshape(-1, out_block)), dtype)
        if _per_channel(arg, _static_4d(result)[1]):
            return relax.const(blocked_per_channel(value, out_block), dtype)
        return arg  # all ones: broadcasts against the blocked operand as it did

    def _blocked_call(self, call: relax.Call, result: relax.Var, args: list, form: Form) -> relax.Call:
        name, a = call.op.name, call.attrs
        out = blocked(self._block(result))
        if name == "relax.nn.conv2d":
            data = "NCHW" if form.plain_input else blocked(self._block(call.args[0]))
            ib = 1 if form.kind in ("depthwise", "plain_input") else self._block(call.args[0])
            return relax.op.nn.conv2d(args[0], args[1], a.strides, a.padding, a.dilation, a.groups, data_layout=data,
                                      kernel_layout=f"OIHW{ib}i{self._block(result)}o", out_layout=out,
                                      out_dtype=a.out_dtype)
        if name in ("relax.nn.max_pool2d", "relax.nn.avg_pool2d"):
            make = relax.op.nn.max_pool2d if name.endswith("max_pool2d") else relax.op.nn.avg_pool2d
            return make(args[0], a.pool_size, a.strides, a.padding, a.dilation, a.ceil_mode, a.count_include_pad,
                        layout=out, out_layout=out)
        if name == "relax.nn.adaptive_avg_pool2d":
            return relax.op.nn.adaptive_avg_pool2d(args[0], a.output_size, layout=out, out_layout=out)
        if name == "relax.nn.layer_norm":
            return relax.op.nn.layer_norm(args[0], args[1], args[2], axes=[1, 4], epsilon=a.epsilon, center=a.center,
                                          scale=a.scale)
        if name == "relax.concat":  # the channel axis of NCHW (-3 there is H here)
            return relax.op.concat(args[0], axis=1)
        if name in _SPATIAL_REDUCE:  # axes as NCHW names them (-1 is W there, the block here)
            return getattr(relax.op, name.removeprefix("relax."))(args[0], axis=[2, 3], keepdims=True)
        return relax.Call(call.op, args, call.attrs, call.ty_args)

    def bindings(self) -> list:
        out = []
        for node in self.graph.nodes:
            out.extend(self.replace.get(node.index, [self.graph.block.bindings[node.index]]))
        return out


def materialize_layouts(bb: relax.BlockBuilder, graph: EmitGraph, lanes: int,
                        report: FusionReport) -> list | None:
    """The block's bindings with every chain worth it blocked (None: nothing changed)."""
    rewriter = ChainRewriter(bb, graph, lanes)
    for chain in find_chains(graph, lanes):
        decision = judge(chain, graph, lanes)
        report.add(decision)
        if decision.accepted:
            rewriter.rewrite(chain)
    return rewriter.bindings() if rewriter.replace else None


__all__ = ["CONVERT_BYTES_PER_S", "CONVERT_SECONDS", "RATES", "Chain", "ChainRewriter", "blocked_per_channel",
           "blocked_weight",
           "channel_block", "find_chains", "judge", "layout_form", "materialize_layouts"]
