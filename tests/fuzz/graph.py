"""The ``graph`` family: a random dataflow graph drawn step by step.

Each step reads earlier values (the latest one most often, so chains form; any earlier one
sometimes, so values get several consumers) and is one of: unary/binary elementwise with
broadcast operands (fresh inputs or constants, including the identities ``+0`` and
``*1``), reductions over random axes (sum/mean/max, keepdims or not), softmax/log_softmax,
layer_norm/rms_norm, written-out softmax and layernorm, matmul (2-D, batched, with a
permuted operand, ``x @ xᵀ``), conv2d (strides, padding, groups), views with real strides
(permute_dims, reshape, strided_slice, squeeze, expand_dims, broadcast_to), casts
(float16, float64, int32) and a functional in-place update (``slice_scatter``). The first
input may carry a symbolic batch dim "n", and may be float16 (the ``fp16`` family).
"""

from __future__ import annotations

from dataclasses import dataclass

from .draw import Draw, seed, size
from .program import Program, Step

UNARY = ["relu", "tanh", "sigmoid", "negative", "abs", "exp", "silu", "gelu", "square", "sqrt_abs", "clip"]
BINARY = ["add", "subtract", "multiply", "divide", "maximum", "minimum"]
EXACT_UNARY = {"relu", "negative", "abs"}  # keep integer-valued inputs integer-valued
EXACT_BINARY = {"maximum", "minimum"}
VIEWS = ["permute_dims", "reshape", "strided_slice", "squeeze", "expand_dims", "broadcast_to"]
FLOAT_ONLY = ["sum", "mean", "max", "softmax", "log_softmax", "written_softmax", "written_layernorm",
              "layer_norm", "rms_norm", "slice_scatter"]
NORMS = ("softmax", "log_softmax", "written_softmax", "written_layernorm", "layer_norm", "rms_norm")


@dataclass(frozen=True)
class Val:
    shape: tuple
    dtype: str
    exact: bool  # integer-valued-preserving provenance: casting to int32 is then deterministic


class _GiveUp(Exception):
    pass


class _Ctx:
    def __init__(self, d: Draw, inputs: list, vals: list[Val], p_hi: int) -> None:
        self.d, self.inputs, self.vals, self.p_hi = d, inputs, vals, p_hi

    def fresh(self, shape: tuple, dtype: str) -> int:
        """A new graph input; returns its value index (inputs come first)."""
        self.inputs.append((tuple(shape), dtype))
        self.vals.insert(len(self.inputs) - 1, Val(tuple(shape), dtype, True))
        return len(self.inputs) - 1


def _conc(shape: tuple) -> list[int]:
    return [i for i, d in enumerate(shape) if d != "n"]


def _operand_shape(d: Draw, shape: tuple) -> tuple[tuple, tuple]:
    """A shape broadcast-compatible with ``shape`` and the broadcast result."""
    rank = len(shape)
    keep = d.int(0, rank) if rank and d.coin() else rank
    other, out = [], list(shape)
    for i, dim in enumerate(shape[rank - keep:], start=rank - keep):
        choice = d.choice(["same", "one", "grow"])
        if choice == "one":
            other.append(1)
        elif choice == "grow" and dim == 1:
            k = d.int(2, 3)
            other.append(k)
            out[i] = k
        else:
            other.append(dim)
    return tuple(other), tuple(out)


def _binary(ctx: _Ctx, i: int, x: Val, op: str) -> tuple[Step, Val]:
    d = ctx.d
    same = [j for j, v in enumerate(ctx.vals) if v.shape == x.shape and v.dtype == x.dtype]
    form = d.choice(["value", "param", "const"] if x.dtype != "int32" else ["value"])
    swap = d.coin()
    if form == "value":
        j = d.choice(same)
        exact = x.exact and ctx.vals[j].exact and op in EXACT_BINARY
        return Step(op, (i, j), {"swap": swap}), Val(x.shape, x.dtype, exact)
    oshape, out = _operand_shape(d, x.shape)
    if form == "param" or "n" in oshape:
        j = ctx.fresh(oshape, x.dtype)
        i = i + 1 if i >= j else i
        return Step(op, (i, j), {"swap": swap}), Val(out, x.dtype, False)
    fill = "rand"
    if op in ("add", "subtract") and d.coin():
        fill = "zero"
    if op == "multiply" and d.coin():
        fill = "one"
    const = {"shape": list(oshape), "seed": seed(d), "fill": fill, "dtype": x.dtype}
    return Step(op, (i,), {"swap": swap, "const": const}), Val(out, x.dtype, False)


def _reduce(ctx: _Ctx, i: int, x: Val, op: str) -> tuple[Step, Val]:
    d, rank = ctx.d, len(x.shape)
    axes = d.subset(rank, 1, rank)
    keepdims = d.coin()
    out = tuple(1 if a in axes else n for a, n in enumerate(x.shape)) if keepdims else tuple(
        n for a, n in enumerate(x.shape) if a not in axes)
    if d.coin():
        axes = [a - rank for a in axes]
    return Step(op, (i,), {"axes": axes, "keepdims": keepdims}), Val(out, x.dtype, False)


def _norm(ctx: _Ctx, i: int, x: Val, op: str) -> tuple[Step, Val] | None:
    d, rank = ctx.d, len(x.shape)
    if op in ("softmax", "log_softmax", "written_softmax"):
        return Step(op, (i,), {"axis": d.int(-rank, rank - 1)}), Val(x.shape, x.dtype, False)
    if op == "written_layernorm":
        return Step(op, (i,), {}), Val(x.shape, x.dtype, False)
    k = d.int(1, min(2, rank))
    tail = x.shape[rank - k:]
    if "n" in tail:
        return None
    p = {"k": k, "gamma": {"shape": list(tail), "seed": seed(d), "dtype": x.dtype}}
    if op == "layer_norm":
        p["beta"] = {"shape": list(tail), "seed": seed(d), "dtype": x.dtype}
    return Step(op, (i,), p), Val(x.shape, x.dtype, False)


def _matmul(ctx: _Ctx, i: int, x: Val) -> tuple[Step, Val] | None:
    d = ctx.d
    *batch, m, k = x.shape
    if k == "n":
        return None
    form = d.choice(["2d", "batched", "self"] if batch else ["2d", "self"])
    if form == "self":  # x @ xᵀ over the last two axes, as in q·kᵀ
        return Step("matmul", (i, i), {"transpose_rhs": True, "rhs_shape": list(x.shape)}), Val(
            (*batch, m, m), x.dtype, False)
    p = size(d, 1, ctx.p_hi)
    transpose = d.coin()
    core = (p, k) if transpose else (k, p)
    rshape = tuple(batch) + core if form == "batched" else core
    params = {"transpose_rhs": transpose, "rhs_shape": list(rshape)}
    if form == "batched" or d.coin():
        j = ctx.fresh(rshape, x.dtype)
        i = i + 1 if i >= j else i
        return Step("matmul", (i, j), params), Val((*batch, m, p), x.dtype, False)
    params["const"] = {"shape": list(rshape), "seed": seed(d), "dtype": x.dtype}
    return Step("matmul", (i,), params), Val((*batch, m, p), x.dtype, False)


def _conv2d(ctx: _Ctx, i: int, x: Val) -> tuple[Step, Val] | None:
    d = ctx.d
    nb, c, h, w = x.shape
    if "n" in (c, h, w):
        return None
    groups = d.choice([g for g in range(1, c + 1) if c % g == 0])
    o = groups * d.int(1, 2)
    pad = d.int(0, 1)
    kh, kw = d.int(1, min(3, h + 2 * pad)), d.int(1, min(3, w + 2 * pad))
    s = d.int(1, 2)
    oh, ow = (h + 2 * pad - kh) // s + 1, (w + 2 * pad - kw) // s + 1
    wshape = (o, c // groups, kh, kw)
    params = {"strides": [s, s], "padding": [pad, pad], "groups": groups}
    out = Val((nb, o, oh, ow), x.dtype, False)
    if d.coin():
        j = ctx.fresh(wshape, x.dtype)
        return Step("conv2d", (i + 1 if i >= j else i, j), params), out
    params["const"] = {"shape": list(wshape), "seed": seed(d), "dtype": x.dtype}
    return Step("conv2d", (i,), params), out


def _view(ctx: _Ctx, i: int, x: Val, op: str) -> tuple[Step, Val] | None:
    d, shape, rank = ctx.d, x.shape, len(x.shape)
    if op == "permute_dims" and rank >= 2:
        perm = d.perm(rank)
        return Step(op, (i,), {"perm": perm}), Val(tuple(shape[a] for a in perm), x.dtype, x.exact)
    if op == "expand_dims":
        axis = d.int(0, rank)
        return Step(op, (i,), {"axis": axis}), Val(shape[:axis] + (1,) + shape[axis:], x.dtype, x.exact)
    ones = [a for a, n in enumerate(shape) if n == 1]
    if op == "squeeze" and ones:
        axis = d.choice(ones)
        return Step(op, (i,), {"axis": axis}), Val(shape[:axis] + shape[axis + 1:], x.dtype, x.exact)
    if op == "broadcast_to" and ones:
        new = list(shape)
        new[d.choice(ones)] = d.int(2, 3)
        if d.coin():
            new = [2] + new
        return Step(op, (i,), {"shape": new}), Val(tuple(new), x.dtype, x.exact)
    long = [a for a in _conc(shape) if shape[a] >= 2]
    if op == "strided_slice" and long:
        axis = d.choice(long)
        n = shape[axis]
        begin = d.int(0, n - 1)
        end = d.int(begin + 1, n)
        stride = d.int(1, 2)
        new = list(shape)
        new[axis] = len(range(begin, end, stride))
        return Step(op, (i,), {"axis": axis, "begin": begin, "end": end, "stride": stride}), Val(
            tuple(new), x.dtype, x.exact)
    if op == "reshape" and rank >= 1 and "n" not in shape[1:]:
        new = reshaped(d, shape)
        return Step(op, (i,), {"shape": new}), Val(tuple(new), x.dtype, x.exact)
    return None


def reshaped(d: Draw, shape: tuple) -> list:
    """A new shape with the same elements in the same order: flattened, two neighbouring
    dims merged, or one dim split (a leading "n" stays)."""
    head = ["n"] if shape and shape[0] == "n" else []
    dims = list(shape[len(head):])
    total = 1
    for n in dims:
        total *= n
    form = d.choice(["flatten", "split", "merge"])
    if form == "flatten" or not dims:
        return head + [total]
    if form == "merge" and len(dims) >= 2:
        a = d.int(0, len(dims) - 2)
        return head + dims[:a] + [dims[a] * dims[a + 1]] + dims[a + 2:]
    a = d.int(0, len(dims) - 1)
    f = d.choice([q for q in range(1, dims[a] + 1) if dims[a] % q == 0])
    return head + dims[:a] + [f, dims[a] // f] + dims[a + 1:]


def _astype(ctx: _Ctx, i: int, x: Val) -> tuple[Step, Val]:
    targets = {"float32": ["float16", "float64"] + (["int32"] if x.exact else []),
               "float16": ["float32"], "float64": ["float32"], "int32": ["float32"]}[x.dtype]
    dtype = ctx.d.choice(targets)
    return Step("astype", (i,), {"dtype": dtype}), Val(x.shape, dtype, x.exact)


def _slice_scatter(ctx: _Ctx, i: int, x: Val) -> tuple[Step, Val] | None:
    long = [a for a in _conc(x.shape) if x.shape[a] >= 2]
    if not long:
        return None
    axis = ctx.d.choice(long)
    begin = ctx.d.int(0, x.shape[axis] - 1)
    end = ctx.d.int(begin + 1, x.shape[axis])
    return Step("slice_scatter", (i,), {"axis": axis, "begin": begin, "end": end}), Val(x.shape, x.dtype, x.exact)


def _view_permute(i: int, x: Val, perm: list[int]) -> tuple[Step, Val]:
    return Step("permute_dims", (i,), {"perm": perm}), Val(tuple(x.shape[a] for a in perm), x.dtype, x.exact)


def _macro(ctx: _Ctx, i: int, op: str) -> list[tuple[Step, Val]] | None:
    """Several steps in the shapes our rewrites look for: a cast round trip (exact or
    rounding), a permutation and its inverse, linear/conv + bias + activation."""
    d, x = ctx.d, ctx.vals[i]
    out: list[tuple[Step, Val]] = []

    def push(made: tuple[Step, Val] | None) -> int:
        if made is None:
            raise _GiveUp
        out.append(made)
        ctx.vals.append(made[1])
        return len(ctx.vals) - 1

    try:
        if op == "cast_pair":
            mid = d.choice(["float16", "float64"] + (["int32"] if x.exact else []))
            j = push((Step("astype", (i,), {"dtype": mid}), Val(x.shape, mid, x.exact)))
            push((Step("astype", (j,), {"dtype": x.dtype}), Val(x.shape, x.dtype, x.exact)))
        elif op == "inverse_permute":
            perm = d.perm(len(x.shape))
            inv = [perm.index(a) for a in range(len(perm))]
            j = push(_view_permute(i, x, perm))
            push(_view_permute(j, ctx.vals[j], inv))
        else:  # linear / conv_block: the op, a bias over the channel axis, an activation
            k = push(_matmul(ctx, i, x) if op == "linear" else _conv2d(ctx, i, x))
            y = ctx.vals[k]
            axis = len(y.shape) - 1 if op == "linear" else 1
            bshape = [1] * (len(y.shape) - axis) if op == "conv_block" else []
            bshape = [1 if y.shape[axis] == "n" else y.shape[axis]] + bshape[1:]  # constants are concrete
            const = {"shape": bshape, "seed": seed(d), "fill": "rand", "dtype": y.dtype}
            k = push((Step("add", (k,), {"swap": d.coin(), "const": const}), Val(y.shape, y.dtype, False)))
            act = d.choice(["relu", "gelu", "silu", "none"])
            if act != "none":
                push((Step(act, (k,)), Val(y.shape, y.dtype, False)))
    except _GiveUp:
        out = []
    del ctx.vals[len(ctx.vals) - len(out):]  # the caller appends them again (fresh inputs shift indices)
    return out or None


MACROS = ["cast_pair", "inverse_permute", "linear", "conv_block"]


def _ops_for(x: Val) -> list[str]:
    rank = len(x.shape)
    ops = list(VIEWS) + ["astype"]
    if x.dtype == "int32":
        return ops + ["negative", "abs", "maximum", "add"]
    ops += UNARY + BINARY
    if x.dtype in ("float32", "float16") and rank >= 1:
        ops += FLOAT_ONLY
        ops += ["conv2d", "conv_block", "conv_block"] if rank == 4 else []
        ops += ["matmul", "linear", "linear", "inverse_permute"] if rank >= 2 else []
        ops += ["cast_pair", "cast_pair"]
    return ops


def _step(ctx: _Ctx, i: int, op: str) -> tuple[Step, Val] | None:
    x = ctx.vals[i]
    if op in UNARY:
        return Step(op, (i,)), Val(x.shape, x.dtype, x.exact and op in EXACT_UNARY)
    if op in BINARY:
        return _binary(ctx, i, x, op)
    if op in ("sum", "mean", "max"):
        return _reduce(ctx, i, x, op)
    if op in NORMS:
        return _norm(ctx, i, x, op)
    if op == "matmul":
        return _matmul(ctx, i, x)
    if op == "conv2d":
        return _conv2d(ctx, i, x)
    if op == "astype":
        return _astype(ctx, i, x)
    if op == "slice_scatter":
        return _slice_scatter(ctx, i, x)
    return _view(ctx, i, x, op)


def _renumber(steps: list[Step], at: int) -> None:
    """A fresh input was inserted at value index ``at``: shift later references."""
    for s in steps:
        s.args = tuple(a + 1 if a >= at else a for a in s.args)


def _first_shape(d: Draw, realistic: bool) -> list:
    rank = d.int(1, 4)
    if not realistic:
        shape = [d.int(1, 4) for _ in range(rank)]
        if rank == 4 and d.coin():
            shape = [1, d.int(1, 4), d.int(2, 5), d.int(2, 5)]
        return shape
    while True:  # up to ~16K elements, odd sizes included
        shape = [size(d, 1, 64) for _ in range(rank)]
        if rank == 4 and d.coin():
            shape = [1, size(d, 1, 32), size(d, 4, 24), size(d, 4, 24)]
        total = 1
        for n in shape:
            total *= n
        if total <= 16384:
            return shape
        rank = max(1, rank - 1)


def graph(d: Draw, realistic: bool = False, dtype: str = "float32", max_steps: int = 6) -> Program:
    shape = _first_shape(d, realistic)
    symbolic = d.int(0, 3) == 0
    if symbolic:
        shape[0] = "n"
    inputs: list = [(tuple(shape), dtype)]
    vals = [Val(tuple(shape), dtype, True)]
    ctx = _Ctx(d, inputs, vals, p_hi=64 if realistic else 5)
    steps: list[Step] = []
    for _ in range(d.int(1, max_steps)):
        last = len(vals) - 1
        i = last if d.int(0, 3) else d.int(0, last)
        op = d.choice(_ops_for(vals[i]))
        n_inputs = len(inputs)
        made = _macro(ctx, i, op) if op in MACROS else _step(ctx, i, op)
        if made is None:
            if len(inputs) > n_inputs:
                raise AssertionError("a step that gives up must not add inputs")
            continue
        if len(inputs) > n_inputs:  # a fresh input went in before the step values
            _renumber(steps, len(inputs) - 1)
        for step, val in made if isinstance(made, list) else [made]:
            steps.append(step)
            vals.append(val)
    if not steps:
        steps.append(Step("relu", (0,)))
        vals.append(Val(vals[0].shape, dtype, False))
    last = len(vals) - 1
    outputs: tuple = (last,)
    if last > len(inputs) and d.int(0, 3) == 0:
        outputs = (last, d.int(len(inputs), last - 1))
    family = "fp16" if dtype == "float16" else "graph"
    return Program(inputs, steps, outputs, n=d.int(1, 4) if symbolic else 3, family=family)
