"""IntegerQDQ: a QDQ model's quantized convolutions and matmuls in integer arithmetic, as
ONNX's ``QLinearConv`` / ``QLinearMatMul`` define them; every other quantize and
dequantize as the arithmetic it is.

A QDQ model (``onnxruntime.quantization.quantize_static``) writes a quantized convolution
as float ops between ``QuantizeLinear`` / ``DequantizeLinear``::

    y = quantize(conv(dequantize(xq, sx, zx), dequantize(wq, sw, 0)) + dequantize(bq, sx*sw, 0), sy, zy)

which the ONNX QDQ convention means as ``QLinearConv(xq, wq, bq)``: the products summed
exactly in int32, one rescale, one rounding::

    acc = conv(xq, wq) + (bq - zx * sum(wq))              # int32, exact
    y   = clip(round_half_even(double(acc) * M) + zy)    # M = float32(float32(sx*sw) / sy)

(``M`` and the float64 product as ONNX's reference ``QLinearConv`` computes them, so a
single convolution gives its bits.)

Taken as written, the float graph rounds every product and partial sum: the two differ
by one unit of ``y`` where a sum falls near a rounding boundary, and the integer form is
the exact sum of the float graph's real-number values, rounded once. Every engine that
runs QDQ models fast computes the integer form; this pass does it where the target has
integer kernels (AVX-512 VNNI: ``schedules.cpu.conv2d_int8``; with AVX2 alone, matmuls
only, in ``legalize_int8_matmul``'s int16 pairs form), records each
rewrite as an ``approximate:qdq_integer`` decision (listed with the library's
approximations), and ``CompileOptions.qdq_integer=False`` keeps the float graph.

A ``MatMul`` by a constant ``[K, N]`` weight (scale per tensor or per column) is taken the
same way, into ``relax.matmul(xq, wq, out_dtype="int32")`` (``schedules.cpu.conv2d_int8.
VNNIMatmul``); an attention's product of two activations stays float.

Rewritten only when the integer form is the QLinearConv of the graph's values:

* ``xq`` uint8 with scalar ``sx``, ``zx``; ``wq`` an int8 constant with scale per tensor
  or per output channel and zero point 0; ``sy``, ``zy`` scalars; bias (optional) an
  int32 constant dequantized with zero point 0 by exactly ``float32(sx * sw)``, added to
  the sums; a constant bias of another scale (GPT-2's Gemms) is added in the float64
  rescale as ``bias / sy``, before the rounding;
* NCHW / OIHW, one group, channels that block for the VNNI kernel (input a multiple of 8,
  output of 16); a matmul's ``K`` a multiple of 4 and ``N`` of 16;
* padding only when ``zx == 0`` (the kernel pads with integer 0, which is real 0 only
  then);
* no sum can overflow int32: ``max(zx, 255 - zx) * sum|wq| + |bq - zx * sum(wq)|`` below
  2^31 for every output channel;
* the conv and its bias add feed nothing else; a ``relu`` between bias and quantize
  clamps at ``zy`` (``quantize(relu(v)) == max(quantize(v), zy)``: rounding is monotone).

A value quantized and dequantized again by the parameters it was dequantized with, after
only a zero ``pad`` or a ``max_pool2d`` (the QDQ pair a quantizer writes after the
explicit pad before a strided convolution), is that value: ``dequantize(quantize(v, s,
z), s, z) == v`` element by element, since every element is ``(xq - z) * s`` for an
integer ``xq`` in range (``round`` undoes the division's rounding error, which is far
below a half) or the pad's 0.0 (``z`` quantized back to 0.0). The pair is dropped, so the
pad folds into the convolution (``relax_passes.FoldPadIntoConv``).

Every other ``quantize`` / ``dequantize`` with constant parameters becomes the ops TVM's
legalization computes, ``float(int32(x) - zp) * scale`` and ``clip(round(v / scale) + zp)``
cast to the narrow type: the same values, as pointwise ops that fuse and take blocked
layouts. Runs first in ``normalize``, before the folds (the importer keeps dequantized
constants: ``relax_passes.narrow_constants``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from aicf_tvm.core.report import APPROXIMATE, Decision, FusionReport

from .dataflow_rewrite import use_counts

QDQ_INTEGER = APPROXIMATE + "qdq_integer"

_INT32_LIMIT = 2**31 - 1
_RANGES = {"uint8": (0, 255), "int8": (-128, 127)}


def _op(name: str) -> tvm.ir.Op:
    return tvm.ir.Op.get(name)


_QUANTIZE, _DEQUANTIZE = _op("relax.quantize"), _op("relax.dequantize")
_CONV, _ADD, _RESHAPE, _RELU = _op("relax.nn.conv2d"), _op("relax.add"), _op("relax.reshape"), _op("relax.nn.relu")
_MATMUL = _op("relax.matmul")


def _linear(expr: relax.Expr, var2val: dict) -> relax.Call | None:
    conv = _producer(expr, var2val, _CONV)
    return conv if conv is not None else _producer(expr, var2val, _MATMUL)


def _along_axis(ndim: int, axis: int, scale: np.ndarray, zero: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """A quantization's scale and zero point shaped to broadcast against data of ``ndim``
    dims: a scalar as rank 0, a vector along ``axis``; None for a vector and rank-0 data."""
    count = max(scale.size, zero.size)
    if count > 1 and ndim == 0:
        return None
    shape = [1] * ndim
    if count > 1:
        shape[axis % ndim] = count
    return scale.reshape(shape if scale.size > 1 else ()), zero.reshape(shape if zero.size > 1 else ())


def _value(expr: relax.Expr, var2val) -> np.ndarray | None:
    """The numpy value of a constant, a dequantize or quantize of constants or a reshape
    of one (as TVM's legalization computes them); else None. ``var2val``: a dict, or a
    function from a var to its bound value."""
    lookup = var2val if callable(var2val) else var2val.get
    while isinstance(expr, relax.Var):
        bound = lookup(expr)
        if bound is None:
            return None
        expr = bound
    if isinstance(expr, tvm.ir.Constant):
        return expr.value.numpy()
    if not isinstance(expr, relax.Call):
        return None
    if expr.op.same_as(_RESHAPE):
        value = _value(expr.args[0], var2val)
        shape = expr.ty.shape
        if value is None or shape is None:
            return None
        return value.reshape([int(d) for d in shape.values])
    if not (expr.op.same_as(_DEQUANTIZE) or expr.op.same_as(_QUANTIZE)):
        return None
    parts = [_value(a, var2val) for a in expr.args]
    if any(p is None for p in parts) or parts[1].dtype != np.float32:
        return None
    data, scale, zero = parts
    params = _along_axis(data.ndim, int(expr.attrs.axis), scale, zero)
    if params is None:
        return None
    scale, zero = params
    out = str(expr.attrs.out_dtype)
    if expr.op.same_as(_DEQUANTIZE):
        if out != "float32":
            return None
        return ((data.astype(np.int64) - zero.astype(np.int64)).astype(np.float32) * scale).astype(np.float32)
    if out not in _RANGES or data.dtype != np.float32:
        return None
    lo, hi = _RANGES[out]
    return np.clip(np.round(data / scale) + zero.astype(np.float32), lo, hi).astype(out)


def constant_value(expr: relax.Expr, lookup=None) -> np.ndarray | None:
    """The value of a constant expression of the forms ``_value`` reads (a dequantized
    constant), None for anything else; ``lookup`` gives a var's bound value
    (``BlockBuilder.lookup_binding``)."""
    return _value(expr, lookup or {})


def _scalar(expr: relax.Expr, var2val: dict) -> float | None:
    value = _value(expr, var2val)
    return None if value is None or value.size != 1 else value.reshape(()).item()


def _producer(expr: relax.Expr, var2val: dict, op: tvm.ir.Op) -> relax.Call | None:
    value = var2val.get(expr) if isinstance(expr, relax.Var) else None
    return value if isinstance(value, relax.Call) and value.op.same_as(op) else None


@dataclass
class QConv:
    """A quantized convolution (or matmul) the pass rewrites: the matched calls and their numbers."""

    conv: relax.Call  # relax.nn.conv2d or relax.matmul
    xq: relax.Expr
    zx: int
    sx: float
    wq: np.ndarray  # int8 OIHW (conv2d) or [K, N] (matmul)
    sw: np.ndarray  # [O] float32
    bias: np.ndarray  # [O] int64, zero when absent
    sy: float
    zy: int
    out_dtype: str
    relu: bool
    members: tuple[str, ...]
    float_bias: np.ndarray | None = None  # [O] float64: a bias of another scale than the sums'

    @property
    def is_matmul(self) -> bool:
        return self.conv.op.same_as(_MATMUL)

    def per_output(self) -> np.ndarray:
        """The weight as int64 rows, one per output channel."""
        w = self.wq.astype(np.int64)
        return w.T if self.is_matmul else w.reshape(w.shape[0], -1)

    def channel_shape(self) -> tuple[int, ...]:
        """The shape of a per-output-channel operand of the output: [1, O, 1, 1] or [N]."""
        channels = self.sw.size
        return (channels,) if self.is_matmul else (1, channels, 1, 1)


def match_qconv(quant: relax.Call, var2val: dict, uses: dict) -> tuple[QConv | None, str]:
    """The QConv that ``quant`` ends, or None with the reason it is not one."""
    sy, zy = _scalar(quant.args[1], var2val), _scalar(quant.args[2], var2val)
    out_dtype = str(quant.attrs.out_dtype)
    if sy is None or zy is None or out_dtype not in _RANGES:
        return None, "output scale or zero point not a scalar constant"
    members = []
    v = quant.args[0]
    relu = _producer(v, var2val, _RELU)
    if relu is not None:
        members.append(v)
        v = relu.args[0]
    bias_expr = None
    add = _producer(v, var2val, _ADD)
    if add is not None:
        members.append(v)
        if _linear(add.args[0], var2val) is not None:
            v, bias_expr = add.args
        else:
            bias_expr, v = add.args
    conv = _linear(v, var2val)
    if conv is None:
        return None, "not a convolution"
    members.append(v)
    if any(uses.get(m, 0) != 1 for m in members):
        return None, "an intermediate value has other uses"
    matmul = conv.op.same_as(_MATMUL)
    a = conv.attrs
    if not matmul and ((str(a.data_layout), str(a.kernel_layout), str(a.out_layout)) != ("NCHW", "OIHW", "NCHW")
                       or int(a.groups) != 1):
        return None, "not a dense NCHW convolution"
    dq_x, dq_w = _producer(conv.args[0], var2val, _DEQUANTIZE), _producer(conv.args[1], var2val, _DEQUANTIZE)
    if dq_x is None or dq_w is None:
        return None, "an operand is not dequantized"
    xq = dq_x.args[0]
    sx, zx = _scalar(dq_x.args[1], var2val), _scalar(dq_x.args[2], var2val)
    if str(xq.ty.dtype) != "uint8" or sx is None or zx is None:
        return None, "input not uint8 with scalar scale and zero point"
    wq = _value(dq_w.args[0], var2val)
    sw, zw = _value(dq_w.args[1], var2val), _value(dq_w.args[2], var2val)
    if wq is None or wq.dtype != np.int8 or sw is None or zw is None or np.any(zw != 0):
        return None, "weight not a constant int8 with zero point 0"
    if matmul and (wq.ndim != 2 or xq.ty.ndim < 2):
        return None, "not a matmul by a 2-D weight"
    channels, out_axis = (wq.shape[1], 1) if matmul else (wq.shape[0], 0)
    if sw.size not in (1, channels) or (sw.size > 1 and int(dq_w.attrs.axis) % wq.ndim != out_axis):
        return None, "weight scale neither per tensor nor per output channel"
    sw = np.broadcast_to(sw.astype(np.float32).reshape(-1), (channels,))
    if (wq.shape[0] % 4 if matmul else wq.shape[1] % 8) or channels % 16:
        return None, "channels do not block for the integer kernel"
    if not matmul and any(int(p) for p in a.padding) and zx != 0:
        return None, "padded input with a nonzero zero point"
    bias = np.zeros(channels, np.int64)
    float_bias = None
    if bias_expr is not None:
        dq_b = _producer(bias_expr, var2val, _RESHAPE)
        dq_b = _producer(dq_b.args[0], var2val, _DEQUANTIZE) if dq_b is not None else _producer(
            bias_expr, var2val, _DEQUANTIZE)
        bq = _value(dq_b.args[0], var2val) if dq_b is not None else None
        sb = _value(dq_b.args[1], var2val) if dq_b is not None else None
        zb = _value(dq_b.args[2], var2val) if dq_b is not None else None
        if bq is None or bq.dtype != np.int32 or bq.size != channels or sb is None or np.any(zb != 0):
            return None, "bias not a dequantized int32 constant per output channel"
        if np.array_equal(np.broadcast_to(sb.astype(np.float32).reshape(-1), (channels,)), np.float32(sx) * sw):
            bias = bq.astype(np.int64).reshape(-1)
        else:  # not an integer of the sums' scale: added in the float64 rescale, as its float value
            float_bias = _value(bias_expr, var2val)
            if float_bias is None or float_bias.size != channels:
                return None, "bias not a constant per output channel"
            float_bias = float_bias.astype(np.float64).reshape(-1)
    names = tuple(m.name for m in reversed(members))
    return QConv(conv, xq, int(zx), float(sx), wq, sw, bias, float(sy), int(zy), out_dtype, relu is not None,
                 names, float_bias), ""


def _fits_int32(q: QConv) -> bool:
    w = q.per_output()
    largest = max(q.zx, 255 - q.zx) * np.abs(w).sum(axis=1) + np.abs(q.bias - q.zx * w.sum(axis=1))
    return bool(np.all(largest <= _INT32_LIMIT))


def integer_qconv(bb: relax.BlockBuilder, q: QConv) -> relax.Expr:
    """The integer form of the module docstring, as Relax ops."""
    a = q.conv.attrs
    if q.is_matmul:
        acc = bb.emit(relax.op.matmul(q.xq, relax.const(q.wq), out_dtype="int32"))
    else:
        acc = bb.emit(relax.op.nn.conv2d(q.xq, relax.const(q.wq), a.strides, a.padding, a.dilation, 1,
                                         out_dtype="int32"))
    offset = q.bias - q.zx * q.per_output().sum(axis=1)
    if np.any(offset):
        acc = bb.emit(relax.op.add(acc, relax.const(offset.astype(np.int32).reshape(q.channel_shape()))))
    scale = (np.float32(q.sx) * q.sw / np.float32(q.sy)).astype(np.float64)  # float32 steps, as ONNX's reference
    scaled = bb.emit(relax.op.multiply(relax.op.astype(acc, "float64"),
                                       relax.const(scale.reshape(q.channel_shape()), "float64")))
    if q.float_bias is not None:  # the bias in units of the output scale, added before the rounding
        shift = q.float_bias / np.float64(np.float32(q.sy))
        scaled = bb.emit(relax.op.add(scaled, relax.const(shift.reshape(q.channel_shape()), "float64")))
    lo, hi = _RANGES[q.out_dtype]
    lo = max(lo, q.zy) if q.relu else lo
    clipped = bb.emit(relax.op.clip(relax.op.round(scaled), lo - q.zy, hi - q.zy))
    shifted = relax.op.add(clipped, relax.const(float(q.zy), "float64")) if q.zy else clipped
    return relax.op.astype(shifted, q.out_dtype)


_PAD, _MAX_POOL = _op("relax.nn.pad"), _op("relax.nn.max_pool2d")


def _same_params(a: relax.Call, b: relax.Call, var2val: dict) -> bool:
    """Two quantize/dequantize calls with equal scalar scale and zero point."""
    pairs = [(_scalar(a.args[i], var2val), _scalar(b.args[i], var2val)) for i in (1, 2)]
    return all(x is not None and x == y for x, y in pairs)


def requantized_value(call: relax.Call, var2val: dict) -> relax.Expr | None:
    """``v`` when ``call`` is ``dequantize(quantize(v, s, z), s, z)`` and ``v`` is a zero pad
    or a max pool of ``dequantize(xq, s, z)`` (module docstring); else None."""
    if not call.op.same_as(_DEQUANTIZE):
        return None
    quant = _producer(call.args[0], var2val, _QUANTIZE)
    if quant is None or not _same_params(call, quant, var2val):
        return None
    v = quant.args[0]
    moved = _producer(v, var2val, _PAD)
    if moved is not None and not (str(moved.attrs.pad_mode) == "constant" and float(moved.attrs.pad_value) == 0.0):
        return None
    moved = moved if moved is not None else _producer(v, var2val, _MAX_POOL)
    if moved is None:
        return None
    source = _producer(moved.args[0], var2val, _DEQUANTIZE)
    if source is None or not _same_params(source, call, var2val) or str(quant.attrs.out_dtype) != str(
            source.args[0].ty.dtype):
        return None
    return v


def dequantize_ops(call: relax.Call, var2val: dict) -> relax.Expr | None:
    """``float(int32(x) - zp) * scale`` (TVM's legalization), scale and zp constants; of a
    constant ``x``, that value computed now (the pipeline never folds a widening cast of a
    narrow constant: ``relax_passes.narrow_constants``)."""
    value = _value(call, var2val)
    if value is not None:
        return relax.const(value)
    return _qdq_ops(call, var2val, "int32", lambda x, scale, zero: relax.op.multiply(
        relax.op.astype(relax.op.subtract(relax.op.astype(x, "int32"), zero), "float32"), scale))


def quantize_ops(call: relax.Call, var2val: dict) -> relax.Expr | None:
    """``clip(round(v / scale) + zp)`` cast to the narrow type (TVM's legalization)."""
    out = str(call.attrs.out_dtype)
    if out not in _RANGES:
        return None
    lo, hi = _RANGES[out]
    return _qdq_ops(call, var2val, "float32", lambda v, scale, zero: relax.op.astype(relax.op.clip(relax.op.add(
        relax.op.round(relax.op.divide(v, scale)), zero), lo, hi), out))


def _qdq_ops(call: relax.Call, var2val: dict, zero_dtype: str, make) -> relax.Expr | None:
    data = call.args[0]
    if str(data.ty.dtype) not in ("float32", "uint8", "int8", "int32") or data.ty.ndim < 0:
        return None
    scale, zero = (_value(a, var2val) for a in call.args[1:])
    if scale is None or zero is None or scale.dtype != np.float32:
        return None
    params = _along_axis(data.ty.ndim, int(call.attrs.axis), scale, zero)
    if params is None:
        return None
    scale, zero = params
    return make(data, relax.const(scale), relax.const(zero.astype(zero_dtype)))


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, integer: bool, report: FusionReport | None, convs: bool = True) -> None:
        super().__init__(mod)
        self.integer, self.report, self.convs = integer, report, convs
        self.var2val: dict = {}
        self.uses: dict = {}

    def visit_function(self, func: relax.Function) -> relax.Expr:
        self.var2val = {b.var: b.value for b in _bindings(func)}
        self.uses = use_counts(func)
        return self.visit_expr(func)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = binding.value
        kept = requantized_value(value, self.var2val) if isinstance(value, relax.Call) else None
        if kept is not None:
            self.set_var_remap(binding.var, self.visit_expr(kept))
            return
        if isinstance(value, relax.Call) and value.op.same_as(_QUANTIZE) and self.integer:
            q, reason = match_qconv(value, self.var2val, self.uses)
            if q is not None and not _fits_int32(q):
                q, reason = None, "an int32 sum could overflow"
            if q is not None and not q.is_matmul and not self.convs:
                q, reason = None, ("integer convolutions need AVX-512 VNNI on this target: AVX2's exact int8 form "
                                   "is slower than the float convolution (docs/numerics.md)")
            if q is not None:
                self._record(q.members + (binding.var.name,), True,
                             "integer conv as QLinearConv: int32 sums, one rescale, round half to even"
                             + ("; its bias (not of the sums' scale) added as float64 before the rounding"
                                if q.float_bias is not None else ""))
                xq = self.visit_expr(q.xq)
                new = integer_qconv(self.builder_, dataclasses.replace(q, xq=xq))
                self._bind(binding, new)
                return
            if reason not in ("not a convolution",):
                self._record((binding.var.name,), False, reason)
        if isinstance(value, relax.Call) and value.op.same_as(_QUANTIZE):
            new = quantize_ops(value, self.var2val)
        elif isinstance(value, relax.Call) and value.op.same_as(_DEQUANTIZE):
            new = dequantize_ops(value, self.var2val)
        else:
            new = None
        if new is None:
            super().visit_var_binding_(binding)
            return
        self._bind(binding, self.visit_expr(new))

    def _bind(self, binding: relax.VarBinding, new: relax.Expr) -> None:
        emit = self.builder_.emit if isinstance(binding.var, relax.DataflowVar) else self.builder_.emit_output
        self.set_var_remap(binding.var, emit(new, binding.var.name))

    def _record(self, members: tuple[str, ...], accepted: bool, note: str) -> None:
        if self.report is not None:
            self.report.add(Decision(QDQ_INTEGER, members, accepted, note=note))


def integer_qdq(mod: tvm.IRModule, integer: bool = True, report: FusionReport | None = None,
                convs: bool = True) -> tvm.IRModule:
    """The pass of the module docstring on every Relax function of ``mod``; ``integer``
    False only decomposes quantize and dequantize; ``convs`` False keeps convolutions
    float (a target whose int8 kernels are matmuls only: AVX2)."""
    if not any(isinstance(f, relax.Function) and _has_qdq(f) for _, f in mod.functions_items()):
        return mod
    rewriter = _Rewriter(mod, integer, report, convs)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function) and _has_qdq(func):
            rewriter.builder_.update_func(gv, rewriter.visit_function(func))
    return relax.transform.DeadCodeElimination()(rewriter.builder_.get())


def _bindings(func: relax.Function) -> list[relax.VarBinding]:
    return [b for blk in getattr(func.body, "blocks", []) for b in blk.bindings if isinstance(b, relax.VarBinding)]


def _has_qdq(func: relax.Function) -> bool:
    return any(isinstance(b.value, relax.Call) and (b.value.op.same_as(_QUANTIZE) or b.value.op.same_as(_DEQUANTIZE))
               for b in _bindings(func))


__all__ = ["QDQ_INTEGER", "QConv", "constant_value", "dequantize_ops", "integer_qconv", "integer_qdq", "match_qconv",
           "quantize_ops", "requantized_value"]
