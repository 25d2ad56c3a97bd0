"""Normalizations and statistics legalized with the corrected two-pass variance.

TOPI computes ``group_norm`` and ``instance_norm`` in one pass, ``E[x²] - E[x]²`` in
float32: when the mean is large against the spread the two terms share most of their
bits and their difference is rounding noise (GroupNorm(32, 256) at input mean 100: error
3e-2 where PyTorch has 5e-6; at mean 1000 the difference went negative and the output
NaN). TOPI's ``layer_norm`` and Relax's ``mean``/``variance`` take two passes, but the
mean is a float32 sum of one element after the other, whose error grows with the row
length times the mean, and ``x - mean`` carries that error into every output
(LayerNorm(768) at mean 100: ten times PyTorch's error).

Here, per row (the points the op reduces together), with ``d = x - m0``::

    m0   = sum(x) / n                              pass 1: an estimate of the mean
    c    = sum(d) / n                              pass 2: what m0 missed
    var  = sum(d * d) / n - c * c                  pass 3 (negative rounding -> 0)
    out  = (d - c) * rsqrt(var + eps) * g + b
    mean = m0 + c

the corrected two-pass algorithm (Chan, Golub and LeVeque 1983; Higham, *Accuracy and
Stability of Numerical Algorithms*, §1.9), in float32 (float64 for float64 data). The
deviations ``d`` are of the size of the spread, not of the mean, so no sum cancels: with
sums of at most ``k`` terms in a chain, the variance is within about ``k * 2^-24`` of its
value relatively (plus ``(c / sigma)^2`` of that, where ``c`` is pass 1's error: tiny
unless the mean exceeds the spread by ~10^4), and ``d - c`` is the deviation from the
mean to float32's precision of ``d``, where TOPI's ``x - mean`` was off by the error of
a float32 mean of the whole row. PyTorch computes its float32 moments with Welford's
update, whose bounds are of the same kind.

The order of each sum is fixed here, not by the schedule (which keeps it): when a row's
points are the input's last axes, a row keeps ``p`` partial sums (``partial_count``), the
point whose last index is ``i`` adding into partial ``i % p``, each partial adding its
points in row-major order, then the partials in order. So no chain is longer than
``n / p + p`` terms, and the partials are contiguous lanes, which the CPU schedule sums
as vectors: three passes cost less than TOPI's serial one or two. Other rows (a norm
over the channels of ``NCHW`` or ``NCHW16c``) keep one sum per row, which the schedules
vectorize across rows (``BlockedNorm`` by lanes of its own). On GPU targets each sum is
one reduction, which the GPU schedules split themselves.

``mean``, ``variance`` and ``std`` (the written-out norms of ONNX exporters, ONNX's
InstanceNormalization, ``torch.var``) take the same sums. float16 data are summed and
normalized in float32, as TOPI does, and rounded once to float16. Other dtypes (bfloat16,
integers) and a reduced axis of static extent 0 keep TVM's legalization.

Sound: each entry computes the op's definition (Relax's; TOPI's formulas up to
rounding): ``mean = m0 + c`` and ``var = E[d²] - E[d]²`` hold exactly for any ``m0``,
and the output is ``(x - mean) * rsqrt(var + eps) * g + b``. NaN and inf propagate as
before (a row with one has a NaN ``c`` or ``var``; the clamp of a negative variance to 0
keeps NaN). Used as ``LegalizeOps`` entries in ``LowerEmits``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import tvm
from tvm import relax, te, tirx

Index = tuple[tirx.Expr, ...]
# an op's axes attr: its axes (IntImm or int), one axis, or None for all of them
Axes = Sequence[tirx.Expr | int] | tirx.Expr | int | None

# Partial sums a row keeps at most, in vectors of 512 bits: the accumulators the CPU
# Reduction rule keeps in flight (``ACCUMULATORS``).
PARTIAL_VECTORS = 4


def _on_gpu() -> bool:
    target = tvm.target.Target.current(allow_none=True)
    return target is not None and "gpu" in target.keys


def accumulation_dtype(dtype: str) -> str:
    """The dtype the sums and the normalization of ``dtype`` data take."""
    return "float64" if dtype == "float64" else "float32"


def partial_count(extent: tirx.Expr, dtype: str) -> int:
    """Partial sums per row over a last axis of ``extent`` summed in ``dtype``: 4, 2 or 1
    whole vectors of lanes (16 float32, a 512-bit register) if that many divide it, which
    the CPU schedule keeps as independent vector accumulators; else its largest divisor
    up to one vector (one accumulator a row, rows stepped together); 1 (one sum) for a
    symbolic extent and on GPUs."""
    if not isinstance(extent, tirx.IntImm) or _on_gpu():
        return 1
    w, lanes = int(extent.value), 512 // tvm.runtime.DataType(dtype).bits
    whole = [v * lanes for v in (PARTIAL_VECTORS, 2, 1) if w % (v * lanes) == 0]
    return whole[0] if whole else next(p for p in range(min(w, lanes), 0, -1) if w % p == 0)


@dataclass(frozen=True)
class Rows:
    """The rows an op reduces: their shape, the extents of a row's points (in the input's
    axis order), the input index of point ``k`` of ``row``, the row of an input index, and
    whether a row's points are the input's last axes (one run of memory, whose last axis
    the partial sums take as lanes). A layer norm over blocked channels (axes 1 and 4 of
    ``NCHW16c``) is not: ``BlockedNorm`` gives it lanes of its own."""

    shape: list[tirx.Expr]
    extents: list[tirx.Expr]
    element: Callable[[Index, Index], Index]
    row_of: Callable[[Index], Index]
    contiguous: bool


def _one_run(shape: list[tirx.Expr], axes: list[int]) -> bool:
    """Whether each axis from the first of ``axes`` longer than 1 on is in ``axes`` or of
    extent 1: a row is one run of memory, its last axis in ``axes`` the fastest."""
    unit = [isinstance(e, tirx.IntImm) and e.value == 1 for e in shape]
    first = next((a for a in axes if not unit[a]), None)
    return first is not None and all(i in axes or unit[i] for i in range(first, len(shape)))


def rows_over(x: te.Tensor, axes: list[int]) -> Rows:
    """Rows over the axes not in ``axes`` (layer and instance norm, mean, variance)."""
    ndim = len(x.shape)
    keep = [i for i in range(ndim) if i not in axes]

    def element(row: Index, k: Index) -> Index:
        where = {**dict(zip(keep, row)), **dict(zip(axes, k))}
        return tuple(where[i] for i in range(ndim))

    return Rows([x.shape[i] for i in keep], [x.shape[i] for i in axes], element,
                lambda i: tuple(i[j] for j in keep), _one_run(list(x.shape), axes))


def group_rows(x: te.Tensor, groups: int, channel: int, axes: list[int]) -> Rows:
    """Rows of a group norm: one per group of ``C / groups`` channels and per index of the
    axes outside ``axes``; a row's points run over its channels and ``axes``."""
    ndim = len(x.shape)
    width = x.shape[channel] // groups
    keep = [i for i in range(ndim) if i not in axes]
    reduced = sorted([*axes, channel])

    def element(row: Index, k: Index) -> Index:
        where = {**dict(zip(keep, row)), **dict(zip(reduced, k))}
        where[channel] = dict(zip(keep, row))[channel] * width + dict(zip(reduced, k))[channel]
        return tuple(where[i] for i in range(ndim))

    return Rows([groups if i == channel else x.shape[i] for i in keep],
                [width if i == channel else x.shape[i] for i in reduced], element,
                lambda i: tuple(i[j] // width if j == channel else i[j] for j in keep),
                _one_run(list(x.shape), reduced))


def _count(rows: Rows, acc: str) -> tirx.Expr:
    n = tirx.const(1, "int64")
    for e in rows.extents:
        n = n * tirx.Cast("int64", e)
    return tirx.Cast(acc, n)


def _row_sum(name: str, rows: Rows, term: Callable[[Index, Index], tirx.Expr],
             acc: str) -> te.Tensor:
    """``sum(term(row, k))`` over a row's points in the order of the module docstring."""
    p = partial_count(rows.extents[-1], acc) if rows.contiguous else 1
    if p == 1:
        def whole(*row: tirx.Expr) -> tirx.Expr:
            k = [te.reduce_axis((0, e), f"k{i}") for i, e in enumerate(rows.extents)]
            return te.sum(term(row, tuple(k)), axis=k)

        return te.compute(rows.shape, whole, name=name)

    def part(*idx: tirx.Expr) -> tirx.Expr:
        row, lane = idx[:-1], idx[-1]
        extents = [*rows.extents[:-1], rows.extents[-1] // p]
        k = [te.reduce_axis((0, e), f"k{i}") for i, e in enumerate(extents)]
        return te.sum(term(row, (*k[:-1], k[-1] * p + lane)), axis=k)

    partial = te.compute([*rows.shape, p], part, name=f"{name}_partial")
    j = te.reduce_axis((0, p), "j")
    return te.compute(rows.shape, lambda *row: te.sum(partial(*row, j), axis=[j]), name=name)


@dataclass(frozen=True)
class Moments:
    """Per row, in the accumulation dtype: the estimate ``m0``, its correction ``c`` (the
    mean is ``m0 + c``) and the variance."""

    m0: te.Tensor
    c: te.Tensor
    var: te.Tensor


def moments(x: te.Tensor, rows: Rows) -> Moments:
    """The corrected two-pass moments of the module docstring."""
    acc = accumulation_dtype(x.dtype)
    n = _count(rows, acc)

    def value(row: Index, k: Index) -> tirx.Expr:
        return x(*rows.element(row, k)).astype(acc)

    s0 = _row_sum(f"{x.name}_sum", rows, value, acc)
    m0 = te.compute(rows.shape, lambda *r: s0(*r) / n, name=f"{x.name}_m0")

    def dev(row: Index, k: Index) -> tirx.Expr:
        return value(row, k) - m0(*row)

    s1 = _row_sum(f"{x.name}_dev_sum", rows, dev, acc)
    s2 = _row_sum(f"{x.name}_sq_sum", rows, lambda row, k: dev(row, k) * dev(row, k), acc)
    c = te.compute(rows.shape, lambda *r: s1(*r) / n, name=f"{x.name}_c")

    def var(*r: tirx.Expr) -> tirx.Expr:
        v = s2(*r) / n - c(*r) * c(*r)
        # only rounding makes it negative; a select (not max) keeps a NaN
        return tirx.Select(v < tirx.const(0, acc), tirx.const(0, acc), v)

    return Moments(m0, c, te.compute(rows.shape, var, name=f"{x.name}_var"))


def _normalize(x: te.Tensor, gamma: te.Tensor, beta: te.Tensor, rows: Rows,
               affine: Callable[[Index], Index], epsilon: float, name: str) -> te.Tensor:
    """``((x - m0) - c) * rsqrt(var + eps) * gamma + beta``, rounded once to x's dtype."""
    acc = accumulation_dtype(x.dtype)
    m = moments(x, rows)
    eps = tirx.const(float(epsilon), acc)
    rstd = te.compute(rows.shape, lambda *r: tirx.const(1.0, acc) / te.sqrt(m.var(*r) + eps),
                      name=f"{x.name}_rstd")  # once per row: a division, not one per element

    def out(*i: tirx.Expr) -> tirx.Expr:
        r = rows.row_of(i)
        y = (x(*i).astype(acc) - m.m0(*r) - m.c(*r)) * rstd(*r)
        return (y * gamma(*affine(i)).astype(acc) + beta(*affine(i)).astype(acc)).astype(x.dtype)

    return te.compute(x.shape, out, name=name)


def _axes(axes: Axes, ndim: int) -> list[int]:
    """Sorted non-negative axes; all of them for None."""
    if axes is None:
        return list(range(ndim))
    return sorted({int(a) % ndim for a in (axes if hasattr(axes, "__len__") else [axes])})


def layer_norm(x: te.Tensor, gamma: te.Tensor, beta: te.Tensor, axes: Axes,
               epsilon: float) -> te.Tensor:
    """``relax.nn.layer_norm``: statistics over ``axes``; gamma and beta indexed by them."""
    ax = _axes(axes, len(x.shape))
    return _normalize(x, gamma, beta, rows_over(x, ax), lambda i: tuple(i[a] for a in ax), epsilon,
                      "T_layer_norm")


def group_norm(x: te.Tensor, gamma: te.Tensor, beta: te.Tensor, num_groups: int, channel_axis: int,
               axes: Axes, epsilon: float) -> te.Tensor:
    """``relax.nn.group_norm``: statistics per group of channels and over ``axes``; gamma
    and beta per channel."""
    ndim = len(x.shape)
    channel = int(channel_axis) % ndim
    rows = group_rows(x, int(num_groups), channel, [a for a in _axes(axes, ndim) if a != channel])
    return _normalize(x, gamma, beta, rows, lambda i: (i[channel],), epsilon, "T_group_norm")


def instance_norm(x: te.Tensor, gamma: te.Tensor, beta: te.Tensor, channel_axis: int, axes: Axes,
                  epsilon: float) -> te.Tensor:
    """``relax.nn.instance_norm``: statistics over ``axes`` per channel; gamma and beta
    per channel."""
    ndim = len(x.shape)
    channel = int(channel_axis) % ndim
    rows = rows_over(x, [a for a in _axes(axes, ndim) if a != channel])
    return _normalize(x, gamma, beta, rows, lambda i: (i[channel],), epsilon, "T_instance_norm")


def statistic(x: te.Tensor, axis: Axes, keepdims: bool, of: str) -> te.Tensor:
    """``mean``, ``variance`` or ``std`` of ``x`` over ``axis``, rounded once to x's dtype."""
    ax = _axes(axis, len(x.shape))
    rows = rows_over(x, ax)
    m = moments(x, rows)
    value = {"mean": lambda r: m.m0(*r) + m.c(*r), "variance": lambda r: m.var(*r),
             "std": lambda r: te.sqrt(m.var(*r))}[of]
    if keepdims:
        shape = [1 if i in ax else e for i, e in enumerate(x.shape)]
        return te.compute(shape, lambda *i: value(rows.row_of(i)).astype(x.dtype), name=f"T_{of}")
    return te.compute(rows.shape, lambda *r: value(r).astype(x.dtype), name=f"T_{of}")


_DTYPES = ("float16", "float32", "float64")


def _keeps_tvm_legalization(call: relax.Call) -> bool:
    """Other dtypes, an empty axis list, and data with an axis of static extent 0 (0 / 0
    as TVM computes it)."""
    ty = call.args[0].ty
    if not isinstance(ty, relax.TensorType) or str(ty.dtype) not in _DTYPES:
        return True
    axes = call.attrs.axis if hasattr(call.attrs, "axis") else call.attrs.axes
    if axes is not None and len(axes) == 0:
        return True
    shape = ty.shape
    return isinstance(shape, relax.ShapeExpr) and any(
        isinstance(v, tirx.IntImm) and v.value == 0 for v in shape.values)


def _legalize(te_func: Callable, attrs: Callable[[tvm.ir.Attrs], tuple], name: str) -> Callable:
    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        if _keeps_tvm_legalization(call):
            return call.op.get_attr("FLegalize")(bb, call)
        return bb.call_te(te_func, *call.args, *attrs(call.attrs), primfunc_name_hint=name)

    return legalize


LEGALIZE_MAP = {
    "relax.nn.layer_norm": _legalize(layer_norm, lambda a: (a.axes, a.epsilon), "layer_norm"),
    "relax.nn.group_norm": _legalize(
        group_norm, lambda a: (a.num_groups, a.channel_axis, a.axes, a.epsilon), "group_norm"),
    "relax.nn.instance_norm": _legalize(
        instance_norm, lambda a: (a.channel_axis, a.axes, a.epsilon), "instance_norm"),
    **{f"relax.{of}": _legalize(statistic, lambda a, of=of: (a.axis, bool(a.keepdims), of), of)
       for of in ("mean", "variance", "std")},
}

__all__ = ["LEGALIZE_MAP", "Moments", "Rows", "accumulation_dtype", "group_norm", "group_rows",
           "instance_norm", "layer_norm", "moments", "partial_count", "rows_over", "statistic"]
