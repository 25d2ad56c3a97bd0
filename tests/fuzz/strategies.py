"""Hypothesis strategy for random Relax programs (see ``program.py`` for their meaning).

``programs()`` draws a small dataflow graph step by step: each step reads earlier values
(the latest one most often, so chains form; any earlier one sometimes, so values get
several consumers) and is one of: unary/binary elementwise with broadcast operands (fresh
inputs or constants, including the identities ``+0`` and ``*1``), reductions over random
axes (sum/mean/max, keepdims or not), softmax/log_softmax, layer_norm/rms_norm, written-out
softmax and layernorm, matmul (2-D, batched, with a permuted operand, ``x @ xᵀ``), conv2d
(strides, padding, groups), views with real strides (permute_dims, reshape, strided_slice,
squeeze, expand_dims, broadcast_to), casts (float16, float64, int32) and a functional
in-place update (``slice_scatter``). The first input may carry a symbolic batch dim "n".
Shapes stay tiny so each example builds in a few seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from .program import Program, Step

UNARY = ["relu", "tanh", "sigmoid", "negative", "abs", "exp", "silu", "gelu", "square", "sqrt_abs", "clip"]
BINARY = ["add", "subtract", "multiply", "divide", "maximum", "minimum"]
EXACT_UNARY = {"relu", "negative", "abs"}  # keep integer-valued inputs integer-valued
EXACT_BINARY = {"maximum", "minimum"}
VIEWS = ["permute_dims", "reshape", "strided_slice", "squeeze", "expand_dims", "broadcast_to"]
F32_ONLY = ["sum", "mean", "max", "softmax", "log_softmax", "written_softmax", "written_layernorm",
            "layer_norm", "rms_norm", "matmul", "conv2d", "slice_scatter"]


@dataclass(frozen=True)
class Val:
    shape: tuple
    dtype: str
    exact: bool  # integer-valued-preserving provenance: casting to int32 is then deterministic


def _conc(shape: tuple) -> list[int]:
    return [i for i, d in enumerate(shape) if d != "n"]


def _seed(draw) -> int:
    return draw(st.integers(0, 2**16))


class _Ctx:
    def __init__(self, draw, inputs: list, vals: list[Val]) -> None:
        self.draw, self.inputs, self.vals = draw, inputs, vals

    def fresh(self, shape: tuple, dtype: str) -> int:
        """A new graph input; returns its value index (inputs come first)."""
        self.inputs.append((tuple(shape), dtype))
        self.vals.insert(len(self.inputs) - 1, Val(tuple(shape), dtype, True))
        return len(self.inputs) - 1


def _operand_shape(draw, shape: tuple) -> tuple[tuple, tuple]:
    """A shape broadcast-compatible with ``shape`` and the broadcast result."""
    rank = len(shape)
    keep = draw(st.integers(0, rank)) if rank and draw(st.booleans()) else rank
    other, out = [], list(shape)
    for i, d in enumerate(shape[rank - keep:], start=rank - keep):
        choice = draw(st.sampled_from(["same", "one", "grow"]))
        if choice == "one":
            other.append(1)
        elif choice == "grow" and d == 1:
            k = draw(st.integers(2, 3))
            other.append(k)
            out[i] = k
        else:
            other.append(d)
    return tuple(other), tuple(out)


def _binary(ctx: _Ctx, i: int, x: Val, op: str) -> tuple[Step, Val]:
    draw = ctx.draw
    same = [j for j, v in enumerate(ctx.vals) if v.shape == x.shape and v.dtype == x.dtype]
    form = draw(st.sampled_from(["value", "param", "const"] if x.dtype != "int32" else ["value"]))
    swap = draw(st.booleans())
    if form == "value":
        j = draw(st.sampled_from(same))
        exact = x.exact and ctx.vals[j].exact and op in EXACT_BINARY
        return Step(op, (i, j), {"swap": swap}), Val(x.shape, x.dtype, exact)
    oshape, out = _operand_shape(draw, x.shape)
    if form == "param" or "n" in oshape:
        j = ctx.fresh(oshape, x.dtype)
        i = i + 1 if i >= j else i
        return Step(op, (i, j), {"swap": swap}), Val(out, x.dtype, False)
    fill = "rand"
    if op in ("add", "subtract") and draw(st.booleans()):
        fill = "zero"
    if op == "multiply" and draw(st.booleans()):
        fill = "one"
    const = {"shape": list(oshape), "seed": _seed(draw), "fill": fill, "dtype": x.dtype}
    return Step(op, (i,), {"swap": swap, "const": const}), Val(out, x.dtype, False)


def _reduce(ctx: _Ctx, i: int, x: Val, op: str) -> tuple[Step, Val]:
    draw, rank = ctx.draw, len(x.shape)
    axes = sorted(draw(st.sets(st.integers(0, rank - 1), min_size=1, max_size=rank)))
    keepdims = draw(st.booleans())
    out = tuple(1 if a in axes else d for a, d in enumerate(x.shape)) if keepdims else tuple(
        d for a, d in enumerate(x.shape) if a not in axes)
    if draw(st.booleans()):
        axes = [a - rank for a in axes]
    return Step(op, (i,), {"axes": axes, "keepdims": keepdims}), Val(out, "float32", False)


def _norm(ctx: _Ctx, i: int, x: Val, op: str) -> tuple[Step, Val] | None:
    draw, rank = ctx.draw, len(x.shape)
    if op in ("softmax", "log_softmax", "written_softmax"):
        return Step(op, (i,), {"axis": draw(st.integers(-rank, rank - 1))}), Val(x.shape, "float32", False)
    if op == "written_layernorm":
        return Step(op, (i,), {}), Val(x.shape, "float32", False)
    k = draw(st.integers(1, min(2, rank)))
    tail = x.shape[rank - k:]
    if "n" in tail:
        return None
    p = {"k": k, "gamma": {"shape": list(tail), "seed": _seed(draw)}}
    if op == "layer_norm":
        p["beta"] = {"shape": list(tail), "seed": _seed(draw)}
    return Step(op, (i,), p), Val(x.shape, "float32", False)


def _matmul(ctx: _Ctx, i: int, x: Val) -> tuple[Step, Val] | None:
    draw = ctx.draw
    *batch, m, k = x.shape
    if k == "n":
        return None
    form = draw(st.sampled_from(["2d", "batched", "self"] if batch else ["2d", "self"]))
    if form == "self":  # x @ xᵀ over the last two axes, as in q·kᵀ
        return Step("matmul", (i, i), {"transpose_rhs": True, "rhs_shape": list(x.shape)}), Val(
            (*batch, m, m), "float32", False)
    p = draw(st.integers(1, 5))
    transpose = draw(st.booleans())
    core = (p, k) if transpose else (k, p)
    rshape = tuple(batch) + core if form == "batched" else core
    params = {"transpose_rhs": transpose, "rhs_shape": list(rshape)}
    if form == "batched" or draw(st.booleans()):
        j = ctx.fresh(rshape, "float32")
        i = i + 1 if i >= j else i
        return Step("matmul", (i, j), params), Val((*batch, m, p), "float32", False)
    params["const"] = {"shape": list(rshape), "seed": _seed(draw)}
    return Step("matmul", (i,), params), Val((*batch, m, p), "float32", False)


def _conv2d(ctx: _Ctx, i: int, x: Val) -> tuple[Step, Val] | None:
    draw = ctx.draw
    nb, c, h, w = x.shape
    if "n" in (c, h, w):
        return None
    groups = draw(st.sampled_from([g for g in range(1, c + 1) if c % g == 0]))
    o = groups * draw(st.integers(1, 2))
    pad = draw(st.integers(0, 1))
    kh, kw = draw(st.integers(1, min(3, h + 2 * pad))), draw(st.integers(1, min(3, w + 2 * pad)))
    s = draw(st.integers(1, 2))
    oh, ow = (h + 2 * pad - kh) // s + 1, (w + 2 * pad - kw) // s + 1
    wshape = (o, c // groups, kh, kw)
    params = {"strides": [s, s], "padding": [pad, pad], "groups": groups}
    out = Val((nb, o, oh, ow), "float32", False)
    if draw(st.booleans()):
        j = ctx.fresh(wshape, "float32")
        return Step("conv2d", (i + 1 if i >= j else i, j), params), out
    params["const"] = {"shape": list(wshape), "seed": _seed(draw)}
    return Step("conv2d", (i,), params), out


def _view(ctx: _Ctx, i: int, x: Val, op: str) -> tuple[Step, Val] | None:
    draw, shape, rank = ctx.draw, x.shape, len(x.shape)
    if op == "permute_dims" and rank >= 2:
        perm = list(draw(st.permutations(range(rank))))
        return Step(op, (i,), {"perm": perm}), Val(tuple(shape[a] for a in perm), x.dtype, x.exact)
    if op == "expand_dims":
        axis = draw(st.integers(0, rank))
        return Step(op, (i,), {"axis": axis}), Val(shape[:axis] + (1,) + shape[axis:], x.dtype, x.exact)
    ones = [a for a, d in enumerate(shape) if d == 1]
    if op == "squeeze" and ones:
        axis = draw(st.sampled_from(ones))
        return Step(op, (i,), {"axis": axis}), Val(shape[:axis] + shape[axis + 1:], x.dtype, x.exact)
    if op == "broadcast_to" and ones:
        axis = draw(st.sampled_from(ones))
        new = list(shape)
        new[axis] = draw(st.integers(2, 3))
        if draw(st.booleans()):
            new = [2] + new
        return Step(op, (i,), {"shape": new}), Val(tuple(new), x.dtype, x.exact)
    long = [a for a in _conc(shape) if shape[a] >= 2]
    if op == "strided_slice" and long:
        axis = draw(st.sampled_from(long))
        d = shape[axis]
        begin = draw(st.integers(0, d - 1))
        end = draw(st.integers(begin + 1, d))
        stride = draw(st.integers(1, 2))
        new = list(shape)
        new[axis] = len(range(begin, end, stride))
        return Step(op, (i,), {"axis": axis, "begin": begin, "end": end, "stride": stride}), Val(
            tuple(new), x.dtype, x.exact)
    if op == "reshape" and rank >= 1 and "n" not in shape[1:]:
        head = ["n"] if shape and shape[0] == "n" else []
        dims = list(shape[len(head):])
        size = 1
        for d in dims:
            size *= d
        form = draw(st.sampled_from(["flatten", "split", "merge"]))
        if form == "flatten" or not dims:
            new = head + [size]
        elif form == "merge" and len(dims) >= 2:
            a = draw(st.integers(0, len(dims) - 2))
            new = head + dims[:a] + [dims[a] * dims[a + 1]] + dims[a + 2:]
        else:
            a = draw(st.integers(0, len(dims) - 1))
            f = draw(st.sampled_from([q for q in range(1, dims[a] + 1) if dims[a] % q == 0]))
            new = head + dims[:a] + [f, dims[a] // f] + dims[a + 1:]
        return Step(op, (i,), {"shape": new}), Val(tuple(new), x.dtype, x.exact)
    return None


def _astype(ctx: _Ctx, i: int, x: Val) -> tuple[Step, Val]:
    targets = {"float32": ["float16", "float64"] + (["int32"] if x.exact else []),
               "float16": ["float32"], "float64": ["float32"], "int32": ["float32"]}[x.dtype]
    dtype = ctx.draw(st.sampled_from(targets))
    return Step("astype", (i,), {"dtype": dtype}), Val(x.shape, dtype, x.exact)


def _slice_scatter(ctx: _Ctx, i: int, x: Val) -> tuple[Step, Val] | None:
    long = [a for a in _conc(x.shape) if x.shape[a] >= 2]
    if not long:
        return None
    axis = ctx.draw(st.sampled_from(long))
    begin = ctx.draw(st.integers(0, x.shape[axis] - 1))
    end = ctx.draw(st.integers(begin + 1, x.shape[axis]))
    return Step("slice_scatter", (i,), {"axis": axis, "begin": begin, "end": end}), Val(x.shape, x.dtype, x.exact)


def _macro(ctx: _Ctx, i: int, op: str) -> list[tuple[Step, Val]] | None:
    """Several steps in the shapes our rewrites look for: a cast round trip (exact or
    rounding), a permutation and its inverse, linear/conv + bias + activation."""
    draw, x = ctx.draw, ctx.vals[i]
    out: list[tuple[Step, Val]] = []

    def push(made: tuple[Step, Val] | None) -> int:
        if made is None:
            raise _GiveUp
        out.append(made)
        ctx.vals.append(made[1])
        return len(ctx.vals) - 1

    try:
        if op == "cast_pair":
            mid = draw(st.sampled_from(["float16", "float64"] + (["int32"] if x.exact else [])))
            j = push((Step("astype", (i,), {"dtype": mid}), Val(x.shape, mid, x.exact)))
            push((Step("astype", (j,), {"dtype": "float32"}), Val(x.shape, "float32", x.exact)))
        elif op == "inverse_permute":
            perm = list(draw(st.permutations(range(len(x.shape)))))
            inv = [perm.index(a) for a in range(len(perm))]
            j = push(_view_permute(i, x, perm))
            push(_view_permute(j, ctx.vals[j], inv))
        else:  # linear / conv_block: the op, a bias over the channel axis, an activation
            k = push(_matmul(ctx, i, x) if op == "linear" else _conv2d(ctx, i, x))
            y = ctx.vals[k]
            axis = len(y.shape) - 1 if op == "linear" else 1
            bshape = [1] * (len(y.shape) - axis) if op == "conv_block" else []
            bshape = [1 if y.shape[axis] == "n" else y.shape[axis]] + bshape[1:]  # constants are concrete
            const = {"shape": bshape, "seed": _seed(draw), "fill": "rand", "dtype": "float32"}
            k = push((Step("add", (k,), {"swap": draw(st.booleans()), "const": const}), Val(y.shape, "float32", False)))
            act = draw(st.sampled_from(["relu", "gelu", "silu", "none"]))
            if act != "none":
                push((Step(act, (k,)), Val(y.shape, "float32", False)))
    except _GiveUp:
        out = []
    del ctx.vals[len(ctx.vals) - len(out):]  # the caller appends them again (fresh inputs shift indices)
    return out or None


class _GiveUp(Exception):
    pass


def _view_permute(i: int, x: Val, perm: list[int]) -> tuple[Step, Val]:
    return Step("permute_dims", (i,), {"perm": perm}), Val(tuple(x.shape[a] for a in perm), x.dtype, x.exact)


MACROS = ["cast_pair", "inverse_permute", "linear", "conv_block"]


def _ops_for(x: Val) -> list[str]:
    rank = len(x.shape)
    ops = list(VIEWS) + ["astype"]
    if x.dtype == "int32":
        return ops + ["negative", "abs", "maximum", "add"]
    ops += UNARY + BINARY
    if x.dtype == "float32" and rank >= 1:
        ops += [o for o in F32_ONLY if o != "conv2d" and (o != "matmul" or rank >= 2)]
        ops += ["conv2d", "conv_block", "conv_block"] if rank == 4 else []
        ops += ["matmul", "linear", "linear", "inverse_permute"] if rank >= 2 else []
        ops += ["cast_pair", "cast_pair"]
    return ops


def _step(ctx: _Ctx, i: int, op: str) -> tuple[Step, Val] | None:
    x = ctx.vals[i]
    if op in UNARY or op in ("negative", "abs"):
        return Step(op, (i,)), Val(x.shape, x.dtype, x.exact and op in EXACT_UNARY)
    if op in BINARY:
        return _binary(ctx, i, x, op)
    if op in ("sum", "mean", "max"):
        return _reduce(ctx, i, x, op)
    if op in ("softmax", "log_softmax", "written_softmax", "written_layernorm", "layer_norm", "rms_norm"):
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


@st.composite
def programs(draw, max_steps: int = 6) -> Program:
    rank = draw(st.integers(1, 4))
    shape = [draw(st.integers(1, 4)) for _ in range(rank)]
    if rank == 4 and draw(st.booleans()):
        shape = [1, draw(st.integers(1, 4)), draw(st.integers(2, 5)), draw(st.integers(2, 5))]
    symbolic = draw(st.integers(0, 3)) == 0
    if symbolic:
        shape[0] = "n"
    inputs: list = [(tuple(shape), "float32")]
    vals = [Val(tuple(shape), "float32", True)]
    ctx = _Ctx(draw, inputs, vals)
    steps: list[Step] = []
    for _ in range(draw(st.integers(1, max_steps))):
        last = len(vals) - 1
        i = last if draw(st.integers(0, 3)) else draw(st.integers(0, last))
        op = draw(st.sampled_from(_ops_for(vals[i])))
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
        vals.append(Val(vals[0].shape, "float32", False))
    last = len(vals) - 1
    outputs: tuple[int, ...] = (last,)
    if last > len(inputs) and draw(st.integers(0, 3)) == 0:
        outputs = (last, draw(st.integers(len(inputs), last - 1)))
    return Program(inputs, steps, outputs, n=draw(st.integers(1, 4)) if symbolic else 3)
