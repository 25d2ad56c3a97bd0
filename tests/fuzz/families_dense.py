"""Families of programs shaped like model layers, at the sizes that reach tiling.

``gemm`` (M, N, K in 1..300, constant (prepacked) or run-time weights, ``x @ Wᵀ``,
batched; bias, activation, residual), ``conv`` (images from 16x16, channels from 16;
strided, padded, grouped, depthwise, pointwise), ``attention`` (q·kᵀ·scale + mask ->
softmax -> ·v, with the head split/merge reshapes of a real layer), ``rownorm`` (softmax,
layer_norm, rms_norm, row reductions over rows up to ~1000 long) and ``elementwise``
(chains with odd last dims: vector tails). ``realistic=False`` draws the same shapes of
graph at a few elements per dim; float16 comes up in about one program in five.
"""

from __future__ import annotations

from .draw import Draw, seed, size
from .program import Builder, Program, Ref

ACTS = ["relu", "gelu", "silu", "tanh", "sigmoid", "none"]


def float_dtype(d: Draw) -> str:
    return "float16" if d.int(0, 4) == 0 else "float32"


def const_spec(d: Draw, shape: list, dtype: str, fill: str = "rand", **extra: float) -> dict:
    return {"shape": list(shape), "seed": seed(d), "fill": fill, "dtype": dtype, **extra}


def activation(b: Builder, d: Draw, x: Ref) -> Ref:
    act = d.choice(ACTS)
    return x if act == "none" else b.step(act, x)


def gemm(d: Draw, realistic: bool = True) -> Program:
    hi = 300 if realistic else 6
    m, k, n = size(d, 1, hi), size(d, 1, hi), size(d, 1, hi)
    dtype = float_dtype(d)
    b = Builder("gemm")
    batch = [size(d, 1, 4)] if d.int(0, 3) == 0 else []
    form = d.choice(["const", "const_t", "runtime", "runtime_t", "runtime_batched"])
    x = b.input(batch + [m, k], dtype)
    transpose = form.endswith("_t")
    rshape = batch + [k, n] if form == "runtime_batched" else ([n, k] if transpose else [k, n])
    params = {"transpose_rhs": transpose, "rhs_shape": rshape}
    if form.startswith("const"):
        y = b.step("matmul", x, const=const_spec(d, rshape, dtype), **params)
    else:
        y = b.step("matmul", x, b.input(rshape, dtype), **params)
    if d.coin():
        y = b.step("add", y, const=const_spec(d, [n], dtype), swap=d.coin())
    y = activation(b, d, y)
    if d.int(0, 3) == 0:
        y = b.step("add", y, b.input(batch + [m, n], dtype))
    return b.build(y)


def conv(d: Draw, realistic: bool = True) -> Program:
    if realistic:
        c, h = size(d, 16, 64), size(d, 16, 40)
        w = h if d.coin() else size(d, 16, 40)
    else:
        c, h, w = d.int(1, 6), d.int(2, 7), d.int(2, 7)
    nb = d.choice([1, 1, 2])
    dtype = float_dtype(d)
    kind = d.choice(["dense", "grouped", "depthwise", "pointwise"])
    divisors = [g for g in range(2, c) if c % g == 0]
    groups = {"dense": 1, "pointwise": 1, "depthwise": c}.get(kind) or (d.choice(divisors) if divisors else 1)
    if kind == "depthwise":
        o = c * d.choice([1, 1, 2])
    elif groups > 1:
        o = groups * d.int(1, 3)
    else:
        o = size(d, 16, 64) if realistic else d.int(1, 6)
    kh = 1 if kind == "pointwise" else d.choice([k for k in (1, 3, 5, 7) if k <= h])
    kw = kh if kh <= w and d.int(0, 3) else d.choice([k for k in (1, 3) if k <= w])
    stride = d.choice([1, 1, 2])
    pad = [d.choice([0, kh // 2]), d.choice([0, kw // 2])]
    b = Builder("conv")
    x = b.input([nb, c, h, w], dtype)
    wshape = [o, c // groups, kh, kw]
    params = {"strides": [stride, stride], "padding": pad, "groups": groups}
    if d.int(0, 3):
        y = b.step("conv2d", x, const=const_spec(d, wshape, dtype), **params)
    else:
        y = b.step("conv2d", x, b.input(wshape, dtype), **params)
    if d.coin():
        y = b.step("add", y, const=const_spec(d, [1, o, 1, 1], dtype))
    y = activation(b, d, y)
    if o == c and stride == 1 and 2 * pad[0] == kh - 1 and 2 * pad[1] == kw - 1 and d.coin():
        y = b.step("add", y, x)  # a residual block
    return b.build(y)


def attention(d: Draw, realistic: bool = True) -> Program:
    nb, heads = d.choice([1, 1, 2]), d.choice([1, 2, 4])
    s = size(d, 1, 128) if realistic else d.int(1, 5)
    dh = d.choice([8, 16, 32, 64]) if realistic else d.int(1, 4)
    dtype = "float16" if d.int(0, 5) == 0 else "float32"
    b = Builder("attention")
    if d.coin():  # q, k, v as inputs
        q, k, v = (b.input([nb, heads, s, dh], dtype) for _ in range(3))
    else:  # one hidden state, projected and split into heads as a transformer layer does
        hidden = heads * dh
        x = b.input([nb, s, hidden], dtype)

        def head(w_seed: int) -> Ref:
            p = b.step("matmul", x, const={"shape": [hidden, hidden], "seed": w_seed, "fill": "rand",
                                           "dtype": dtype}, transpose_rhs=False, rhs_shape=[hidden, hidden])
            r = b.step("reshape", p, shape=[nb, s, heads, dh])
            return b.step("permute_dims", r, perm=[0, 2, 1, 3])

        q, k, v = head(seed(d)), head(seed(d)), head(seed(d))
    scores = b.step("matmul", q, k, transpose_rhs=True, rhs_shape=[nb, heads, s, dh])
    scores = b.step("multiply", scores, const=const_spec(d, [], dtype, "value", value=float(dh) ** -0.5))
    mask = d.choice(["none", "causal_inf", "causal_big", "input"])
    if mask == "input":
        scores = b.step("add", scores, b.input([1, 1, s, s], dtype))
    elif mask != "none":
        big = float("-inf") if mask == "causal_inf" else -1e4
        scores = b.step("add", scores, const=const_spec(d, [1, 1, s, s], dtype, "causal", value=big))
    probs = b.step(d.choice(["softmax", "softmax", "written_softmax"]), scores, axis=-1)
    out = b.step("matmul", probs, v, transpose_rhs=False, rhs_shape=[nb, heads, s, dh])
    if d.coin():
        out = b.step("permute_dims", out, perm=[0, 2, 1, 3])
        out = b.step("reshape", out, shape=[nb, s, heads * dh])
    return b.build(out)


def rownorm(d: Draw, realistic: bool = True) -> Program:
    length = size(d, 1, 1030) if realistic else d.int(1, 6)
    rows = [size(d, 1, 64)] if realistic else [d.int(1, 4)]
    if d.coin():
        rows = [d.int(1, 3)] + rows
    dtype = float_dtype(d)
    b = Builder("rownorm")
    x = b.input(rows + [length], dtype)
    if length <= 256 and d.int(0, 2) == 0:  # a linear layer produces the rows
        x = b.step("matmul", x, const=const_spec(d, [length, length], dtype), transpose_rhs=False,
                   rhs_shape=[length, length])
    op = d.choice(["softmax", "log_softmax", "written_softmax", "layer_norm", "rms_norm", "written_layernorm",
                   "sum", "mean", "max"])
    if op in ("softmax", "log_softmax", "written_softmax"):
        y = b.step(op, x, axis=-1 if d.int(0, 3) else -2)
    elif op in ("layer_norm", "rms_norm"):
        p = {"k": 1, "gamma": const_spec(d, [length], dtype)}
        if op == "layer_norm":
            p["beta"] = const_spec(d, [length], dtype)
        y = b.step(op, x, **p)
    elif op == "written_layernorm":
        y = b.step(op, x)
    else:
        y = b.step(op, x, axes=[-1], keepdims=d.coin())
    if d.coin():
        y = activation(b, d, b.step("multiply", y, const=const_spec(d, [], dtype)))
    return b.build(y)


UNARY = ["relu", "tanh", "sigmoid", "negative", "abs", "exp", "silu", "gelu", "square", "sqrt_abs", "clip"]
BINARY = ["add", "subtract", "multiply", "divide", "maximum", "minimum"]


def elementwise(d: Draw, realistic: bool = True) -> Program:
    last = size(d, 1, 1100) if realistic else d.int(1, 9)
    lead = [d.choice([1, 2, 3, 5, 7, 16, 17]) for _ in range(d.int(0, 2))] if realistic else [
        d.int(1, 3) for _ in range(d.int(0, 2))]
    shape = lead + [last]
    dtype = float_dtype(d)
    b = Builder("elementwise")
    x = b.input(shape, dtype)
    for _ in range(d.int(2, 5)):
        kind = d.choice(["unary", "unary", "const", "input", "cast", "transpose"])
        if kind == "unary":
            x = b.step(d.choice(UNARY), x)
        elif kind == "const":  # scalar, last-dim vector, column, or full
            form = d.choice(["scalar", "row", "col", "full"])
            oshape = {"scalar": [], "row": [last], "col": lead + [1], "full": shape}[form]
            x = b.step(d.choice(BINARY), x, const=const_spec(d, oshape, dtype), swap=d.coin())
        elif kind == "input":
            x = b.step(d.choice(BINARY), x, b.input(shape if d.coin() else [last], dtype), swap=d.coin())
        elif kind == "cast" and dtype == "float32":
            x = b.step("astype", b.step("astype", x, dtype="float16"), dtype="float32")
        elif kind == "transpose" and len(shape) >= 2:  # a strided read, then back
            perm = list(range(len(shape)))
            perm[-1], perm[-2] = perm[-2], perm[-1]
            x = b.step("permute_dims", b.step("relu", b.step("permute_dims", x, perm=perm)), perm=perm)
    return b.build(x)
