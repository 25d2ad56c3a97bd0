"""Conv1dAsConv2d: a 1-D convolution becomes the 2-D one over a height of 1.

``conv1d(x, w)[n, o, t] = sum_{c, k} x[n, c, t s + k d - p] w[o, c, k]`` is
``conv2d(x[:, :, None, :], w[:, :, None, :])[n, o, 0, t]`` with strides ``(1, s)``,
dilation ``(1, d)`` and padding ``(0, p_left, 0, p_right)``: the same products over the
same channels and taps (the height axis has one position and one tap). TVM legalizes a
conv1d into a PrimFunc that only the generic convolution rule (an im2col GEMM) takes, while
a conv2d joins the convolution chains that ``MaterializeEmits`` blocks (NCHW16c) and the
blocked direct convolution schedules, which run a grouped convolution such as wav2vec2's
positional one (768 channels in 16 groups, 128 taps over 49 frames) several times faster
than the im2col GEMM; Whisper's two front convolutions and wav2vec2's feature encoder are
conv1ds.

Only the plain layouts (``NCW`` data and output, ``OIW`` kernel) are rewritten. The
pipeline runs this pass where blocked layouts exist (``pipeline.layout_lanes``): elsewhere
both forms take the same rule. A constant weight is reshaped here, at compile time; any
other weight gets an ``expand_dims``. Runs on op-level Relax, before LiftEmits.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from .dataflow_rewrite import rewrite_op_calls


def _plain(call: relax.Call) -> bool:
    a = call.attrs
    out_layout = str(a.out_layout) if a.out_layout else str(a.data_layout)
    return str(a.data_layout) == "NCW" and str(a.kernel_layout) == "OIW" and out_layout == "NCW"


def _with_height(weight: relax.Expr) -> relax.Expr:
    """``weight [O, I, K]`` as ``[O, I, 1, K]``."""
    if isinstance(weight, tvm.ir.Constant):
        return relax.const(weight.value.numpy()[:, :, None, :], str(weight.ty.dtype))  # float64 stays float64
    return relax.op.expand_dims(weight, [2])


def _conv1d_rewrite():
    data, weight = wildcard(), wildcard()
    pattern = is_op("relax.nn.conv1d")(data, weight)

    def rewrite(expr: relax.Expr, matches: dict) -> relax.Expr:
        if not isinstance(expr, relax.Call) or not _plain(expr) or not isinstance(expr.ty, relax.TensorType):
            return expr
        a = expr.attrs
        (left, right) = [int(p) for p in a.padding]
        out_dtype = str(a.out_dtype) if a.out_dtype is not None and str(a.out_dtype) else None
        conv = relax.op.nn.conv2d(
            relax.op.expand_dims(matches[data], [2]), _with_height(matches[weight]),
            strides=(1, int(a.strides[0])), padding=(0, left, 0, right),
            dilation=(1, int(a.dilation[0])), groups=int(a.groups), data_layout="NCHW",
            kernel_layout="OIHW", out_layout="NCHW", out_dtype=out_dtype)
        return relax.op.reshape(conv, list(expr.ty.shape))

    return pattern, rewrite


def _per_channel(value: np.ndarray, channels: int) -> bool:
    """Whether ``value`` broadcasts against ``[N, channels, W]`` as one value per channel
    (``[channels, 1]``, ``[1, channels, 1]``) or one value (any shape of one element)."""
    shape = list(value.shape)
    while len(shape) > 2 and shape[0] == 1:
        shape.pop(0)
    return value.size == 1 or shape == [channels, 1]


def _bias_rewrite():
    """``add(reshape(conv2d(..)), bias)`` -> ``reshape(add(conv2d(..), bias'))`` for the
    reshape this pass made (a 4-D conv2d over a height of 1 to its 3-D value) and a bias of
    one value per channel, ``bias'`` its ``[1, C, 1, 1]`` form: the same sum at the same
    elements, so the bias and what follows it (``SinkReshapes``) can join the convolution's
    epilogue."""
    conv = is_op("relax.nn.conv2d")(wildcard(), wildcard())
    shaped, bias = is_op("relax.reshape")(conv, wildcard()), wildcard()
    pattern = is_op("relax.add")(shaped, bias)

    def rewrite(expr: relax.Expr, matches: dict) -> relax.Expr:
        out, four = matches[shaped], matches[conv]
        if not (isinstance(four.ty, relax.TensorType) and isinstance(out.ty, relax.TensorType)
                and isinstance(expr.ty, relax.TensorType) and expr.ty.ndim == 3  # the sum broadcasts to 3-D
                and four.ty.ndim == 4 and out.ty.ndim == 3 and isinstance(four.ty.shape[2], tvm.tirx.IntImm)
                and int(four.ty.shape[2]) == 1 and isinstance(four.ty.shape[1], tvm.tirx.IntImm)):
            return expr
        channels = int(four.ty.shape[1])
        if not isinstance(matches[bias], tvm.ir.Constant) or str(matches[bias].ty.dtype) != str(out.ty.dtype):
            return expr
        value = matches[bias].value.numpy()
        if not _per_channel(value, channels):
            return expr
        value = value.reshape(1, channels, 1, 1) if value.size == channels else value.reshape(())
        return relax.op.reshape(relax.op.add(four, relax.const(value, str(value.dtype))), list(out.ty.shape))

    return pattern, rewrite


@relax.transform.function_pass(opt_level=0, name="Conv1dAsConv2d")
class Conv1dAsConv2d:
    """Rewrite every plain-layout ``conv1d`` as a ``conv2d`` over a height of 1."""

    def transform_function(self, func: relax.Function, mod: tvm.IRModule,
                           ctx: tvm.transform.PassContext) -> relax.Function:
        return rewrite_op_calls(rewrite_op_calls(func, *_conv1d_rewrite()), *_bias_rewrite())


__all__ = ["Conv1dAsConv2d"]
