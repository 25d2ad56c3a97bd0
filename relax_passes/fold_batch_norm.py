"""FoldBatchNorm: every batch_norm becomes the arithmetic it means, folded into the
convolution before it where the fold computes the same function.

``relax.op.nn.batch_norm(x, gamma, beta, mean, var, axis, epsilon, center, scale,
momentum, training)`` returns ``(out, mean', var')``. With ``training=False`` it
normalizes by the moving statistics it is given and returns them; with ``training=True``
(the op's default) it normalizes by the batch's own statistics over every axis but
``axis`` and returns the moving ones updated by ``momentum``. gamma scales only when
``scale``, beta shifts only when ``center``. TVM's ``FoldBatchnormToConv2D`` ignores
center, scale, training, the channel axis and the dtype (it adds a float32 epsilon to a
float16 variance), and ``DecomposeOpsForInference`` uses the moving statistics whatever
``training`` says. This pass takes the place of both for batch_norm:

* **fold**: ``batch_norm(conv(x, W), ...)[0]`` becomes ``conv(x, W * s) + t`` with
  ``s = (gamma if scale else 1) / sqrt(var + epsilon)`` along the kernel's output-channel
  axis and ``t = (beta if center else 0) - mean * s`` along the output's channel axis:
  the same function in exact arithmetic. Only for ``training=False``, a constant weight
  and constant statistics, a batch-norm axis that is the conv output's channel axis,
  plain layouts (no blocked dimension), floating-point dtypes, and finite folded values
  (computed in float64 at compile time, rounded once to the weight's and the output's
  dtypes). Anything else is decomposed instead.
* **decompose** every other batch_norm as ``topi.nn.batch_norm`` computes it (what TVM's
  default build runs): ``(x - mean) / sqrt(var + epsilon)``, times gamma if scale, plus
  beta if center, with the given statistics in inference and the batch's
  (``mean``/``variance`` over the other axes) in training.

Runs on op-level Relax, before LiftEmits; afterwards no batch_norm is left for
``DecomposeOpsForInference`` to misread.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import TupleGetItemPattern, is_const, is_op, rewrite_call, wildcard

from aicf_tvm.core.errors import UnsupportedModelError

_BATCH_NORM = "relax.nn.batch_norm"
_CONVS = ("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d")


def _is_plain(layout: str, ndim: int) -> bool:
    """One upper-case letter per dimension: no blocked (``NCHW8c``) dimension."""
    return len(layout) == len(set(layout)) == ndim and layout.isalpha() and layout.isupper()


def _is_float(dtype: str | tvm.DataType) -> bool:
    return str(dtype) in ("float16", "float32", "float64")


def folded_weights(conv: relax.Call, bn: relax.Call) -> tuple[np.ndarray, np.ndarray] | None:
    """``(W * s, t)`` for ``bn(conv(x, W))[0] == conv(x, W * s) + t``, or None when the
    fold is not the same function (see the module docstring)."""
    a, ca = bn.attrs, conv.attrs
    ndim = conv.ty.ndim
    out_layout = str(ca.out_layout or ca.data_layout)
    kernel_layout = str(ca.kernel_layout)
    if bool(a.training) or not (_is_plain(out_layout, ndim) and _is_plain(kernel_layout, ndim)):
        return None
    if "C" not in out_layout or "O" not in kernel_layout:
        return None
    if int(a.axis) % ndim != out_layout.index("C"):
        return None
    weight = conv.args[1].value.numpy()
    out_dtype = str(conv.ty.dtype)
    if not (_is_float(weight.dtype) and _is_float(out_dtype)):
        return None
    gamma, beta, mean, var = (np.asarray(c.value.numpy(), np.float64) for c in bn.args[1:])
    w_shape, t_shape = [1] * ndim, [1] * ndim
    w_shape[kernel_layout.index("O")] = t_shape[int(a.axis) % ndim] = -1
    with np.errstate(all="ignore"):
        s = (gamma if bool(a.scale) else 1.0) / np.sqrt(var + float(a.epsilon))
        t = (beta if bool(a.center) else 0.0) - mean * s
        w = (weight.astype(np.float64) * s.reshape(w_shape)).astype(weight.dtype)
        t = t.reshape(t_shape).astype(out_dtype)
    if not (np.isfinite(w).all() and np.isfinite(t).all()):
        return None
    return w, t


def _fold_rewrite():
    data = wildcard()
    weight = is_const()
    convs = [is_op(name)(data, weight) for name in _CONVS]
    conv = convs[0] | convs[1] | convs[2]
    bn = is_op(_BATCH_NORM)(conv, is_const(), is_const(), is_const(), is_const())

    def rewrite(expr: relax.Expr, matches: dict) -> relax.Expr:
        call = next(matches[c] for c in convs if c in matches)
        found = folded_weights(call, matches[bn])
        if found is None:
            return expr
        w, t = found
        # dtypes given: relax.const makes a float64 array float32
        folded = relax.Call(call.op, [matches[data], relax.const(w, str(w.dtype))], call.attrs)
        return relax.op.add(folded, relax.const(t, str(t.dtype)))

    return TupleGetItemPattern(bn, 0), rewrite


def decompose(bn: relax.Call) -> relax.Expr:
    """The tuple ``bn`` returns, written in elementwise and reduction ops."""
    data, gamma, beta, moving_mean, moving_var = bn.args
    a = bn.attrs
    ndim, dtype = data.ty.ndim, str(data.ty.dtype)
    if ndim < 0:
        raise UnsupportedModelError(
            f"batch_norm on {data} of unknown rank: give the input a known rank")
    axis = int(a.axis) % ndim
    others = [i for i in range(ndim) if i != axis]

    def per_channel(v: relax.Expr) -> relax.Expr:
        return relax.op.expand_dims(v, others) if others else v

    if bool(a.training):
        mean, var = relax.op.mean(data, others), relax.op.variance(data, others)
    else:
        mean, var = moving_mean, moving_var
    eps = relax.const(float(a.epsilon), dtype)
    out = relax.op.divide(relax.op.subtract(data, per_channel(mean)),
                          relax.op.sqrt(relax.op.add(per_channel(var), eps)))
    if bool(a.scale):
        out = relax.op.multiply(out, per_channel(gamma))
    if bool(a.center):
        out = relax.op.add(out, per_channel(beta))
    if not bool(a.training):
        return relax.Tuple([out, moving_mean, moving_var])
    m = float(a.momentum)

    def update(moving: relax.Expr, batch: relax.Expr) -> relax.Expr:
        kind = str(moving.ty.dtype)
        return relax.op.add(relax.op.multiply(relax.const(1.0 - m, kind), moving),
                            relax.op.multiply(relax.const(m, kind), batch))

    return relax.Tuple([out, update(moving_mean, mean), update(moving_var, var)])


@relax.transform.function_pass(opt_level=0, name="FoldBatchNorm")
class FoldBatchNorm:
    """Fold inference batch-norms into the conv before them where exact; decompose the rest."""

    def transform_function(self, func: relax.Function, mod: tvm.IRModule,
                           ctx: tvm.transform.PassContext) -> relax.Function:
        if func.attrs is not None and "Primitive" in func.attrs and int(func.attrs["Primitive"]):
            return func
        pattern, rewrite = _fold_rewrite()
        func = rewrite_call(pattern, rewrite, func)
        any_bn = is_op(_BATCH_NORM)(*[wildcard() for _ in range(5)])
        return rewrite_call(any_bn, lambda expr, matches: decompose(expr), func)


__all__ = ["FoldBatchNorm", "decompose", "folded_weights"]
