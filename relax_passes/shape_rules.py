"""The shape rules: per Relax op, what its operands' dims must satisfy for its inferred type.

Relax's shape inference types an op whose operands' dims it cannot relate as if they were
related (it refuses only dims *proven* different): ``matmul([a, b], [16, 8])`` is
``[a, 8]``, ``reshape([a, b], [16, 8])`` assumes ``a * b == 128``, ``broadcast_to([a, b],
[a, 16])`` assumes ``b`` is 1 or 16, a ``strided_slice`` marked ``assume_inbound`` (TVM's
ONNX frontend marks every slice with a symbolic bound) has ``end - begin`` rows even past
the end of its input. Each rule here returns those conditions for one call, with the role
each plays, as TIR boolean expressions over the operands' dims; ``_RULES`` maps an op to
its rule, and an op without one requires nothing but dims that are not negative
(``output_dims``, which applies to every op).

Sound: each condition is the op's own precondition, the one PyTorch and ONNX Runtime check
and raise on; where it holds, the inferred type is the op's result type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tvm
from tvm import relax, tirx

Cond = tuple[tvm.ir.Expr, str]  # a condition and the role it plays for the op


def _int(x: int | tvm.ir.Expr) -> tvm.ir.Expr:
    return tirx.IntImm("int64", int(x)) if isinstance(x, int) else x


def _eq(a: int | tvm.ir.Expr, b: int | tvm.ir.Expr) -> tvm.ir.Expr:
    return tirx.EQ(_int(a), _int(b))


def _le(a: int | tvm.ir.Expr, b: int | tvm.ir.Expr) -> tvm.ir.Expr:
    return tirx.LE(_int(a), _int(b))


def _any_of(*conds: tvm.ir.Expr) -> tvm.ir.Expr:
    out = conds[0]
    for c in conds[1:]:
        out = tirx.Or(out, c)
    return out


def type_shape(ty: relax.Type | None) -> list[tvm.ir.Expr] | None:
    """The dims of a tensor type whose shape is known, else None."""
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return list(ty.shape.values)


def _shape(expr: relax.Expr) -> list[tvm.ir.Expr] | None:
    return type_shape(getattr(expr, "ty", None))


def _product(dims: list) -> tvm.ir.Expr:
    out = _int(1)
    for d in dims:
        out = out * _int(d)
    return out


def _matmul(call: relax.Call) -> list[Cond]:
    a, b = (_shape(x) for x in call.args[:2])
    if a is None or b is None:
        return []
    conds = [(_eq(a[-1], b[0] if len(b) == 1 else b[-2]), "its contraction dims")]
    for x, y in zip(a[-3::-1], b[-3::-1]):  # batch dims, aligned from the right
        conds.append((_any_of(_eq(x, y), _eq(x, 1), _eq(y, 1)), "its batch dims broadcast"))
    return conds


def _reshape(call: relax.Call) -> list[Cond]:
    a, out = _shape(call.args[0]), _shape(call)
    if a is None or out is None:
        return []
    return [(_eq(_product(a), _product(out)), "the element counts of its input and output")]


def _broadcast_to(call: relax.Call) -> list[Cond]:
    a, out = _shape(call.args[0]), _shape(call)
    if a is None or out is None:
        return []
    return [(_any_of(_eq(x, 1), _eq(x, y)), f"its input's dim {k} is 1 or the output's")
            for k, (x, y) in enumerate(zip(a, out[len(out) - len(a):]))]


def _strided_slice(call: relax.Call) -> list[Cond]:
    """A slice assumed in bounds (constant steps) reads from ``begin`` towards ``end``: every
    index it reads must exist."""
    data = _shape(call.args[0])
    if not call.attrs.assume_inbound or data is None:
        return []
    fields = [list(a.fields) if isinstance(a, relax.Tuple) else None for a in call.args[1:]]
    axes, begin, end = fields[:3]
    strides = fields[3] if len(fields) > 3 else [_int(1)] * len(axes or [])
    if None in (axes, begin, end, strides):
        return []
    conds = []
    for axis, lo, hi, step in zip(axes, begin, end, strides):
        if not (isinstance(axis, tirx.IntImm) and isinstance(step, tirx.IntImm) and step.value):
            continue
        dim = data[axis.value % len(data)]
        if step.value > 0:
            cond = tirx.And(tirx.And(_le(0, lo), _le(lo, hi)), _le(hi, dim))
        else:
            cond = tirx.And(tirx.And(_le(-1, hi), _le(hi, lo)), tirx.LT(lo, _int(dim)))
        conds.append((cond, f"its slice of axis {axis.value} within the input"))
    return conds


def _conv(call: relax.Call) -> list[Cond]:
    x, w = _shape(call.args[0]), _shape(call.args[1])
    if x is None or w is None:
        return []
    channels = x[str(call.attrs.data_layout).index("C")]
    kernel = w[str(call.attrs.kernel_layout).index("I")]
    if "transpose" in call.op.name:  # the kernel's I axis holds every input channel
        return [(_eq(channels, kernel), "the input's channels and the kernel's")]
    return [(_eq(channels, kernel * int(call.attrs.groups)),
             "the input's channels and the kernel's times groups")]


def _einsum(call: relax.Call) -> list[Cond]:
    shapes = [_shape(t) for t in call.args[0].fields]
    inputs = str(call.attrs.subscripts).split("->")[0].split(",")
    if None in shapes or any("." in s for s in inputs):
        return []
    first: dict[str, Any] = {}
    conds = []
    for labels, shape in zip(inputs, shapes):
        for label, dim in zip(labels, shape):
            if label in first:
                conds.append((_eq(first[label], dim), f"every dim labelled {label}"))
            first.setdefault(label, dim)
    return conds


def _attention(call: relax.Call) -> list[Cond]:
    q, k, v = (_shape(t) for t in call.args[:3])
    if None in (q, k, v):
        return []
    qk, kv = (q, k, "queries and keys"), (k, v, "keys and values")
    pairs = [(qk, 0, "batch"), (kv, 0, "batch"), (qk, 2, "heads"), (kv, 2, "heads"),
             (qk, 3, "head size"), (kv, 1, "length")]
    return [(_eq(a[axis], b[axis]), f"the {what} of {names}")
            for (a, b, names), axis, what in pairs]


def _per_channel(call: relax.Call, params: list[int], axes: list[int]) -> list[Cond]:
    """Each of the operands ``params`` has the data's dims on ``axes``."""
    x = _shape(call.args[0])
    conds = []
    for p in params if x is not None else []:
        shape = _shape(call.args[p])
        if shape is not None and len(shape) == len(axes):
            conds += [(_eq(d, x[a % len(x)]), "its scale and shift match the normalized dims")
                      for d, a in zip(shape, axes)]
    return conds


def _norm(params: list[int], axis_attr: str) -> Callable[[relax.Call], list[Cond]]:
    def rule(call: relax.Call) -> list[Cond]:
        axes = getattr(call.attrs, axis_attr)
        axes = [axes] if isinstance(axes, (int, tirx.IntImm)) else list(axes)
        return _per_channel(call, params, [int(a) for a in axes])
    return rule


def _prelu(call: relax.Call) -> list[Cond]:
    alpha = _shape(call.args[1])
    return [(_any_of(c, _eq(alpha[0], 1)), "its slopes are one or one per channel")
            for c, _ in _per_channel(call, [1], [int(call.attrs.axis)])]


def _squeeze(call: relax.Call) -> list[Cond]:
    x = _shape(call.args[0])
    if x is None or call.attrs.axis is None:
        return []
    return [(_eq(x[int(a) % len(x)], 1), f"its squeezed dim (axis {int(a)}) is 1")
            for a in call.attrs.axis]


def _slice_scatter(call: relax.Call) -> list[Cond]:
    """The rows land within the data: ``0 <= start <= end <= dim`` on the axis, and (step 1)
    the rows are ``end - start`` long there."""
    data, rows = _shape(call.args[0]), _shape(call.args[1])
    bounds = [a if isinstance(getattr(a, "ty", None), tvm.ir.PrimType) else None for a in call.args[2:5]]
    if data is None or rows is None or any(b is None for b in bounds[:2]):
        return []
    start, end = bounds[0], bounds[1]
    axis = int(call.attrs.axis) % len(data)
    conds = [(tirx.And(tirx.And(_le(0, start), _le(start, end)), _le(end, data[axis])),
              f"its slice of axis {axis} within the data")]
    step = bounds[2] if len(bounds) > 2 else None
    if step is None or (isinstance(step, tirx.IntImm) and step.value == 1):
        conds.append((_eq(rows[axis], end - start), f"its rows fill the slice of axis {axis}"))
    return conds


def _scatter_elements(call: relax.Call) -> list[Cond]:
    i, u = _shape(call.args[1]), _shape(call.args[2])
    if i is None or u is None:
        return []
    return [(_eq(a, b), "its indices and updates have one shape") for a, b in zip(i, u)]


_CONVS = ("conv1d", "conv2d", "conv3d", "conv1d_transpose", "conv2d_transpose")
_RULES: dict[str, Callable[[relax.Call], list[Cond]]] = {
    "relax.matmul": _matmul, "relax.reshape": _reshape, "relax.broadcast_to": _broadcast_to,
    "relax.strided_slice": _strided_slice, "relax.einsum": _einsum,
    "relax.nn.attention": _attention, "relax.squeeze": _squeeze,
    "relax.scatter_elements": _scatter_elements, "relax.slice_scatter": _slice_scatter, "relax.nn.prelu": _prelu,
    **{f"relax.nn.{op}": _conv for op in _CONVS},
    "relax.nn.layer_norm": _norm([1, 2], "axes"), "relax.nn.rms_norm": _norm([1], "axes"),
    "relax.nn.group_norm": _norm([1, 2], "channel_axis"),
    "relax.nn.instance_norm": _norm([1, 2], "channel_axis"),
    "relax.nn.batch_norm": _norm([1, 2, 3, 4], "axis"),
}


def output_dims(call: relax.Call) -> list[Cond]:
    """Every symbolic dim of every tensor the call returns is at least 0."""
    types = call.ty.fields if isinstance(call.ty, relax.TupleType) else [call.ty]
    return [(_le(0, d), "its output dims are not negative") for t in types
            for d in (type_shape(t) or []) if not isinstance(d, tirx.IntImm)]


def conditions(call: relax.Call) -> list[Cond]:
    """What ``call`` requires of its operands' dims (module docstring)."""
    rule = _RULES.get(call.op.name)
    return [*(rule(call) if rule else []), *output_dims(call)]


__all__ = ["Cond", "conditions", "output_dims", "type_shape"]
