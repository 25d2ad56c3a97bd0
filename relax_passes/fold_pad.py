"""FoldPadIntoConv: a zero ``nn.pad`` of a convolution's spatial borders becomes the
convolution's own padding.

``conv(pad(x, widths, "constant", 0.0), W, padding=p)`` becomes ``conv(x, W, padding=p +
widths)``: TOPI's convolution pads its input with +0.0 before the reduction, so the fold
reads the same values at the same positions (interior elements NaN and inf included) and
computes the same function, asymmetric widths too (TensorFlow's "SAME" padding pads one
more row after than before). The pad then runs inside the conv kernel, folded into its
index bounds as predicates, instead of as a separate pass over the whole tensor (a fifth
of MobileNetV2's time).

Folded only when every condition holds: constant mode; a pad value of exactly +0.0 (a
nonzero or -0.0 value is not what the convolution pads with); zero widths on the batch
and channel axes and non-negative ones on the spatial axes (a negative width crops); a
plain data layout (one letter per dimension); conv1d/2d/3d (a transposed convolution's
padding means something else). Any other pad stays. A pad read by other ops stays for
them; ``DeadCodeElimination`` removes it when the convolution was its only reader.

Runs on op-level Relax, before LiftEmits (``aicf_tvm.driver.pipeline.normalize``).
"""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from .dataflow_rewrite import rewrite_op_calls

_PAD = "relax.nn.pad"
_CONVS = {
    "relax.nn.conv1d": relax.op.nn.conv1d,
    "relax.nn.conv2d": relax.op.nn.conv2d,
    "relax.nn.conv3d": relax.op.nn.conv3d,
}
_SPATIAL = "DHW"  # the order of a conv's padding attr: befores of D, H, W, then afters


def folded_padding(pad: relax.Call, conv: relax.Call) -> tuple[int, ...] | None:
    """The conv padding equal to ``pad`` followed by ``conv``, or None when the fold would
    change the function (see the module docstring)."""
    pa, ca = pad.attrs, conv.attrs
    value = float(pa.pad_value)
    if str(pa.pad_mode) != "constant" or value != 0.0 or math.copysign(1.0, value) < 0:
        return None
    layout = str(ca.data_layout)
    widths = [int(w) for w in pa.pad_width]
    if len(widths) != 2 * len(layout) or len(layout) != len(set(layout)) or not layout.isupper():
        return None
    spatial = [a for a in _SPATIAL if a in layout]
    if sorted(spatial) != sorted(a for a in layout if a not in "NC") or len(spatial) + 2 != len(layout):
        return None
    if any(widths[2 * layout.index(a) + k] != 0 for a in "NC" for k in (0, 1)):
        return None
    before = [widths[2 * layout.index(a)] for a in spatial]
    after = [widths[2 * layout.index(a) + 1] for a in spatial]
    if min(before + after) < 0:
        return None
    padding = [int(p) for p in ca.padding]
    if len(padding) != 2 * len(spatial):
        return None
    n = len(spatial)
    return tuple(padding[i] + before[i] for i in range(n)) + tuple(padding[n + i] + after[i] for i in range(n))


def _fold_rewrite():
    data, weight = wildcard(), wildcard()
    pad = is_op(_PAD)(data)
    convs = {name: is_op(name)(pad, weight) for name in _CONVS}
    any_conv = convs["relax.nn.conv1d"] | convs["relax.nn.conv2d"] | convs["relax.nn.conv3d"]

    def rewrite(expr: relax.Expr, matches: dict) -> relax.Expr:
        # rewrite_call also offers the var a refused match is bound to: only calls fold
        found = matches.get(pad) if isinstance(expr, relax.Call) else None
        padding = folded_padding(found, expr) if isinstance(found, relax.Call) else None
        if padding is None:
            return expr
        a = expr.attrs
        return _CONVS[expr.op.name](
            matches[data], matches[weight], strides=a.strides, padding=padding, dilation=a.dilation,
            groups=a.groups, data_layout=a.data_layout, kernel_layout=a.kernel_layout,
            out_layout=a.out_layout, out_dtype=a.out_dtype,
        )

    return any_conv, rewrite


@relax.transform.function_pass(opt_level=0, name="FoldPadIntoConv")
class FoldPadIntoConv:
    """Fold zero spatial pads into the convolutions that read them."""

    def transform_function(self, func: relax.Function, mod: tvm.IRModule,
                           ctx: tvm.transform.PassContext) -> relax.Function:
        return rewrite_op_calls(func, *_fold_rewrite())


__all__ = ["FoldPadIntoConv", "folded_padding"]
