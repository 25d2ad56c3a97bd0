"""ClipPoolWindows: an average pool whose one window covers its whole input pools that input.

``transformers``' EfficientNet ends in ``nn.AvgPool2d(hidden_dim, ceil_mode=True)``: a
2560x2560 window over a 7x7 map. TOPI computes it as written: the input padded to
2566x2566 with zeros (ceil mode), a 2560x2560 sum per output, divided by the window
clipped to the input (``min(k - 1, n - 1) + 1`` = 7 per axis). Its FLOP estimate (1.7e10)
made it the costliest task of a tuning run, and MetaSchedule's own space for it
materialized the padded buffer (67 GB for 2560 channels): the first task of
``aicf tune`` never finished a trial.

Per spatial axis with one output position, no padding, dilation 1 and a window ``k`` at
least the input extent ``n``, the window becomes ``n`` (stride 1, ceil mode off). That is
the same function bit for bit: the divisor is ``min(k - 1, n - 1) + 1 = n`` before and
after, and the sum reads the same elements in the same row-major order, the ones it
drops being the padding's +0.0 (a running sum that starts at +0.0 is never -0.0 in
round-to-nearest, so adding +0.0 leaves it exactly as it was, NaN and inf included).
Only ``avg_pool1d/2d/3d`` with a plain layout; a max pool is left alone (its -inf
padding meets NaN through comparisons, whose order matters).

Runs on op-level Relax, before LiftEmits (``aicf_tvm.driver.pipeline.normalize``).
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from .dataflow_rewrite import rewrite_op_calls

_POOLS = {
    "relax.nn.avg_pool1d": relax.op.nn.avg_pool1d,
    "relax.nn.avg_pool2d": relax.op.nn.avg_pool2d,
    "relax.nn.avg_pool3d": relax.op.nn.avg_pool3d,
}
_SPATIAL = "DHW"


def clipped_window(call: relax.Call) -> list[int] | None:
    """The pool size equal to ``call``'s with every whole-input window clipped to the
    input, or None when no axis clips or the shapes are not static."""
    a = call.attrs
    layout = str(a.layout)
    spatial = [ax for ax in _SPATIAL if ax in layout]
    if len(layout) != len(spatial) + 2 or set(layout) - set(_SPATIAL) != {"N", "C"} or str(a.out_layout) != layout:
        return None
    data_ty, out_ty = call.args[0].ty, call.ty
    if not (isinstance(data_ty, relax.TensorType) and isinstance(out_ty, relax.TensorType)):
        return None
    shape, out = data_ty.shape, out_ty.shape
    if shape is None or out is None or not all(isinstance(d, tvm.tirx.IntImm) for d in [*shape, *out]):
        return None
    n = len(spatial)
    pool = [int(k) for k in a.pool_size]
    padding = [int(p) for p in a.padding]
    dilation = [int(d) for d in a.dilation]
    clipped = list(pool)
    for i, ax in enumerate(spatial):
        extent, outputs = int(shape[layout.index(ax)]), int(out[layout.index(ax)])
        if outputs == 1 and padding[i] == padding[n + i] == 0 and dilation[i] == 1 and pool[i] >= extent:
            clipped[i] = extent
    return clipped if clipped != pool else None


def _clip_rewrite():
    data = wildcard()
    patterns = [is_op(name)(data) for name in _POOLS]
    pattern = patterns[0] | patterns[1] | patterns[2]

    def rewrite(expr: relax.Expr, matches: dict) -> relax.Expr:
        window = clipped_window(expr) if isinstance(expr, relax.Call) else None
        if window is None:
            return expr
        a = expr.attrs
        strides = [1 if w != int(k) else int(s) for w, k, s in zip(window, a.pool_size, a.strides)]
        whole = [w != int(k) for w, k in zip(window, a.pool_size)]
        # ceil mode changes no output count on the clipped axes (one window, exactly the input)
        # nor elsewhere when it was off; it stays on only where an unclipped axis needs it
        ceil = bool(a.ceil_mode) and not all(whole)
        return _POOLS[expr.op.name](matches[data], pool_size=window, strides=strides, padding=a.padding,
                                    dilation=a.dilation, ceil_mode=ceil, count_include_pad=a.count_include_pad,
                                    layout=a.layout, out_layout=a.out_layout)

    return pattern, rewrite


@relax.transform.function_pass(opt_level=0, name="ClipPoolWindows")
class ClipPoolWindows:
    """Clip every average-pool window that covers its whole input to that input."""

    def transform_function(self, func: relax.Function, mod: tvm.IRModule,
                           ctx: tvm.transform.PassContext) -> relax.Function:
        return rewrite_op_calls(func, *_clip_rewrite())


__all__ = ["ClipPoolWindows", "clipped_window"]
