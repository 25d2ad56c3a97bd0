"""Families aimed at the facts our rewrites rely on, where an audit found them unchecked.

``special``: signed zeros, infinities and NaN in inputs and constants, through the
identities a simplifier likes (``x + 0.0``, ``x - (-0.0)``, ``x * 0.0``, ``1 / x``,
``max(x, -0.0)`` next to ``max(x, 0.0)``, ``1 / (x * 0.0)``). ``batchnorm``: center/scale off, training on,
axis != 1, float16, after a conv (the fold) or alone. ``indexing``: scatter/gather/take
with the index forms the reference defines (negative indices where it reads them from the
end: scatter_elements, take's wrap/clip). ``axis_reshape``: prelu, softmax, layer_norm,
concat and mean next to reshapes that move their axis. ``const_roles``: one constant in
two roles (``x @ W + W``). ``zero_size``: an input with a 0 dim. ``tuple_out``: nested
tuple outputs, an input among them.
"""

from __future__ import annotations

from .draw import Draw, seed, size
from .families_dense import activation, const_spec, float_dtype
from .graph import graph, reshaped
from .program import Builder, Program, Ref

IDENTITIES = [  # (op, constant fill): each is exact on ordinary numbers, not on all of IEEE
    ("add", "zero"), ("add", "negzero"), ("subtract", "negzero"), ("subtract", "zero"),
    ("multiply", "zero"), ("multiply", "negzero"), ("multiply", "one"), ("div", "inf"), ("div", "one"),
    ("maximum", "zero"), ("maximum", "negzero"), ("minimum", "zero"), ("minimum", "negzero"),
    ("add", "inf"), ("multiply", "nan"), ("add", "special"), ("multiply", "special"),
]


def special(d: Draw, realistic: bool = False) -> Program:
    shape = [size(d, 1, 300 if realistic else 24)]
    if d.coin():
        shape = [d.int(1, 4)] + shape
    b = Builder("special")
    x = b.input(shape, "float32", special=d.int(0, 3) > 0)
    if d.int(0, 3) == 0:  # max(x, 0.0) and max(x, -0.0) side by side: two different functions
        op = d.choice(["maximum", "minimum"])
        scalar = [] if d.coin() else [1]
        pos = b.step(op, x, const=const_spec(d, scalar, "float32", "zero"), swap=d.coin())
        neg = b.step(op, x, const=const_spec(d, scalar, "float32", "negzero"), swap=d.coin())
        return b.build((pos, neg))
    y = x
    if d.int(0, 2) == 0:  # one identity on the input itself: nothing downstream hides a zero's sign
        op, fill = d.choice(IDENTITIES)
        return b.build(b.step(op, x, const=const_spec(d, d.choice([[], [1], shape[-1:], shape]), "float32", fill),
                              swap=d.coin()))
    for _ in range(d.int(1, 4)):
        kind = "zero_divisor" if d.int(0, 11) == 0 else d.choice(
            ["identity", "identity", "identity", "reciprocal", "unary", "input", "sum"])
        if kind == "zero_divisor":  # 1 / (x * 0.0): ±inf, or NaN, all folded at compile time
            zero = b.step("multiply", y, const=const_spec(d, d.choice([[], [1]]), "float32",
                                                          d.choice(["zero", "negzero"])))
            y = b.step("reciprocal", zero) if d.coin() else b.step("div", y, zero)
        elif kind == "identity":
            op, fill = d.choice(IDENTITIES)
            oshape = d.choice([[], [1], shape[-1:], shape])
            y = b.step(op, y, const=const_spec(d, oshape, "float32", fill), swap=d.coin())
        elif kind == "reciprocal":
            y = b.step("reciprocal", y)
        elif kind == "unary":
            y = b.step(d.choice(["relu", "abs", "negative", "exp", "tanh", "sqrt_abs"]), y)
        elif kind == "input":
            other = b.input(shape, "float32", special=d.coin())
            y = b.step(d.choice(["add", "subtract", "multiply", "div", "maximum", "minimum"]), y, other,
                       swap=d.coin())
        else:
            y = b.step(d.choice(["sum", "max"]), y, axes=[-1], keepdims=True)
    return b.build(y)


LAYOUTS = {"nchw": 1, "nhwc": 3, "nc": 1, "nlc": 2}  # non-negative: topi's training mode needs it


def batchnorm(d: Draw, realistic: bool = False) -> Program:
    layout = d.choice(list(LAYOUTS))
    dtype = float_dtype(d)
    c = size(d, 16, 64) if realistic else d.int(1, 5)
    hw = (size(d, 8, 24), size(d, 8, 24)) if realistic else (d.int(1, 5), d.int(1, 5))
    nb = d.int(1, 2) if realistic else d.int(1, 3)
    b = Builder("batchnorm")
    if layout in ("nchw", "nhwc") and d.coin():  # a conv before it: the fold
        cin = size(d, 1, 32) if realistic else d.int(1, 4)
        conv = {"strides": [1, 1], "padding": [1, 1], "groups": 1}
        if layout == "nchw":
            x = b.step("conv2d", b.input([nb, cin, *hw], dtype), const=const_spec(d, [c, cin, 3, 3], dtype), **conv)
        elif d.coin():  # an NHWC conv (HWIO weight)
            x = b.step("conv2d", b.input([nb, *hw, cin], dtype), const=const_spec(d, [3, 3, cin, c], dtype),
                       layout="NHWC", **conv)
        else:
            x = b.step("conv2d", b.input([nb, cin, *hw], dtype), const=const_spec(d, [c, cin, 3, 3], dtype), **conv)
            x = b.step("permute_dims", x, perm=[0, 2, 3, 1])
    else:
        shape = {"nchw": [nb, c, *hw], "nhwc": [nb, *hw, c], "nc": [nb, c], "nlc": [nb, hw[0], c]}[layout]
        x = b.input(shape, dtype)
    stats = {k: const_spec(d, [c], dtype, "positive" if k == "var" else "rand")
             for k in ("gamma", "beta", "mean", "var")}
    t = b.step("batch_norm", x, axis=LAYOUTS[layout], eps=d.choice([1e-5, 1e-3]), center=d.int(0, 2) > 0,
               scale=d.int(0, 2) > 0, training=d.int(0, 2) == 0, momentum=d.choice([0.1, 0.5]), **stats)
    y = b.step("item", t, index=0)
    if d.coin():
        y = b.step("relu", y)
    form = d.choice(["out", "out", "stats", "nested"])
    if form == "out":
        return b.build(y)
    mean, var = b.step("item", t, index=1), b.step("item", t, index=2)
    return b.build((y, mean, var) if form == "stats" else (y, (mean, var)))


def indexing(d: Draw, realistic: bool = False) -> Program:
    hi = 64 if realistic else 5
    rank = d.int(1, 3)
    shape = [size(d, 1, hi) for _ in range(rank)]
    dtype = float_dtype(d)
    b = Builder("indexing")
    x = b.input(shape, dtype)
    if d.coin():  # a producer the scatter/gather may be fused with
        x = b.step(d.choice(["exp", "relu", "tanh"]), x)
    op = d.choice(["scatter_elements", "scatter_nd", "gather_elements", "gather_nd", "take"])
    axis = d.int(0, rank - 1)
    if op in ("scatter_elements", "gather_elements"):
        ishape = [d.int(1, n) for n in shape]
        idx = {"kind": "along", "shape": ishape, "seed": seed(d), "dims": [shape[axis]], "axis": axis,
               "negative": op == "scatter_elements" and d.coin()}
        params = {"indices": idx, "axis": axis - rank if d.coin() else axis}
        if op == "gather_elements":
            y = b.step(op, x, **params)
        else:
            y = _scatter(b, d, x, ishape, dtype, op, params)
    elif op in ("scatter_nd", "gather_nd"):
        k = d.int(1, rank)
        count = 1
        for n in shape[:k]:
            count *= n
        m = d.int(1, count)
        idx = {"kind": "nd", "shape": [m, k], "seed": seed(d), "dims": shape[:k]}
        if op == "gather_nd":
            y = b.step(op, x, indices=idx)
        else:
            y = _scatter(b, d, x, [m] + shape[k:], dtype, op, {"indices": idx})
    else:
        mode = d.choice(["fast", "wrap", "clip"])
        ishape = [size(d, 1, hi) for _ in range(d.int(1, 2))]
        idx = {"kind": "take", "shape": ishape, "seed": seed(d), "dims": [shape[axis]], "negative": mode != "fast"}
        y = b.step("take", x, indices=idx, axis=axis, mode=mode)
    if d.coin():
        y = b.step(d.choice(["relu", "negative", "sigmoid"]), y)
    return b.build(y)


def _scatter(b: Builder, d: Draw, x: Ref, ushape: list, dtype: str, op: str, params: dict) -> Ref:
    params["reduction"] = d.choice(["update", "update", "add"])
    if d.coin():
        return b.step(op, x, b.input(ushape, dtype), **params)
    return b.step(op, x, updates=const_spec(d, ushape, dtype), **params)


def axis_reshape(d: Draw, realistic: bool = False) -> Program:
    hi = 48 if realistic else 4
    shape = [size(d, 1, hi) for _ in range(d.int(1, 3))]
    dtype = float_dtype(d)
    b = Builder("axis_reshape")
    x = b.input(shape, dtype)
    new, unit = list(shape), None
    if d.coin():  # a unit dim inserted somewhere: the axis op may land on it
        unit = d.choice([len(new)] + list(range(len(new) + 1)))  # often last: past the source's rank
        new.insert(unit, 1)
    else:
        new = reshaped(d, tuple(shape))
    before = d.coin()  # reshape -> axis op, or axis op -> reshape -> elementwise
    cur, cur_shape = (b.step("reshape", x, shape=new), new) if before else (x, shape)
    rank = len(cur_shape)
    op = d.choice(["prelu", "prelu", "softmax", "layer_norm", "concat", "mean"])
    axis = unit if op == "prelu" and before and unit is not None else d.int(-rank, rank - 1)
    if op == "prelu":
        alpha = [cur_shape[axis]]
        if unit is None and d.int(0, 3) == 0:  # a run-time slope (a constant one is a scalar on a unit dim)
            y = b.step("prelu", cur, b.input(alpha, dtype), axis=axis)
        else:
            y = b.step("prelu", cur, alpha=const_spec(d, alpha, dtype), axis=axis)
    elif op == "softmax":
        y = b.step("softmax", cur, axis=axis)
    elif op == "layer_norm":
        y = b.step("layer_norm", cur, k=1, gamma=const_spec(d, cur_shape[-1:], dtype),
                   beta=const_spec(d, cur_shape[-1:], dtype))
    elif op == "concat":
        other = list(cur_shape)
        other[axis] = d.int(1, 3)
        y = b.step("concat", cur, b.input(other, dtype), axis=axis)
        cur_shape = list(cur_shape)
        cur_shape[axis] += other[axis]
    else:
        keep = d.coin()
        y = b.step("mean", cur, axes=[axis], keepdims=keep)
        cur_shape = [n for a, n in enumerate(cur_shape) if a != axis % rank] if not keep else [
            1 if a == axis % rank else n for a, n in enumerate(cur_shape)]
    if not before and cur_shape:
        y = b.step("reshape", y, shape=reshaped(d, tuple(cur_shape)))
    return b.build(activation(b, d, y))


def const_roles(d: Draw, realistic: bool = False) -> Program:
    k = size(d, 16, 200) if realistic else d.int(1, 6)
    dtype = float_dtype(d)
    b = Builder("const_roles")
    w = const_spec(d, [k, k], dtype)
    x = b.input([k, k], dtype)
    mm = {"transpose_rhs": False, "rhs_shape": [k, k], "const": w}
    form = d.choice(["mm_add", "mm_mul", "mm_mm", "bias_and_weight"])
    y = b.step("matmul", x, **mm)
    if form == "mm_add":
        y = b.step("add", y, const=w, swap=d.coin())
    elif form == "mm_mul":
        y = b.step("multiply", y, const=w)
    elif form == "mm_mm":
        y = b.step("matmul", activation(b, d, y), **mm)
    else:  # W[0] as a bias is another constant; the whole W as a residual is this one
        y = b.step("add", b.step("add", y, const=const_spec(d, [k], dtype)), const=w)
    return b.build(activation(b, d, y))


def zero_size(d: Draw, realistic: bool = False) -> Program:
    hi = 64 if realistic else 5
    shape = [size(d, 1, hi) for _ in range(d.int(1, 3))]
    zero_at = d.int(0, len(shape) - 1)
    shape[zero_at] = 0
    b = Builder("zero_size")
    x = b.input(shape, "float32")
    # no reshape: a 0 in a Relax reshape's shape means "keep this dim"
    op = d.choice(["unary", "const", "slice", "permute", "sum", "softmax", "matmul", "concat"])
    if op == "unary":
        y = b.step(d.choice(["relu", "exp", "negative"]), x)
    elif op == "const":
        y = b.step(d.choice(["add", "multiply"]), x, const=const_spec(d, [1] * len(shape), "float32"))
    elif op == "slice" and max(shape) >= 2:
        axis = shape.index(max(shape))
        y = b.step("strided_slice", x, axis=axis, begin=1, end=shape[axis], stride=d.int(1, 2))
    elif op == "permute" and len(shape) >= 2:
        y = b.step("permute_dims", x, perm=d.perm(len(shape)))
    elif op == "sum":
        y = b.step("sum", x, axes=[d.int(0, len(shape) - 1)], keepdims=d.coin())
    elif op == "softmax" and any(n for n in shape):
        y = b.step("softmax", x, axis=d.choice([a for a, n in enumerate(shape) if n]))
    elif op == "matmul" and len(shape) >= 2:
        p = size(d, 1, hi)
        y = b.step("matmul", x, const=const_spec(d, [shape[-1], p], "float32"), transpose_rhs=False,
                   rhs_shape=[shape[-1], p])
    else:
        other = list(shape)
        other[zero_at] = d.int(1, 3)
        y = b.step("concat", x, b.input(other, "float32"), axis=zero_at)
    return b.build(activation(b, d, y))


def tuple_out(d: Draw, realistic: bool = False) -> Program:
    """A ``graph`` program whose outputs are regrouped into nested tuples (an input may be
    one of them, and a value may appear twice)."""
    prog = graph(d, realistic)
    values = len(prog.inputs) + len(prog.steps)
    picks = [d.int(0, values - 1) for _ in range(d.int(2, 4))]
    picks[0] = values - 1
    shape = d.choice(["a(bc)", "(ab)c", "a(b)", "((ab))c"])
    a, bb, *rest = picks
    c = rest[0] if rest else bb
    prog.outputs = {"a(bc)": (a, (bb, c)), "(ab)c": ((a, bb), c), "a(b)": (a, (bb,)),
                    "((ab))c": (((a, bb),), c)}[shape]
    prog.family = "tuple_out"
    return prog


__all__ = ["axis_reshape", "batchnorm", "const_roles", "indexing", "special", "tuple_out", "zero_size"]
