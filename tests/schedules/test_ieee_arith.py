"""IEEEArithmetic: float ``+ - * /`` in fused kernels round as the graph's ops do.

Every two-operation expression shape over ``+ - * /`` goes through ``aicf_tvm.compile``
(one fused elementwise kernel each) and through TVM's default build (one kernel per op);
every three-operation shape goes through one scheduled, vectorized kernel with the pass and
is compared with numpy, which rounds each float32 op once.  Operands cover ±0, ±inf, NaN,
subnormals, ±3e38, the rounding magic number 1.5 * 2^23 and ordinary values, in every
combination; leaves repeat in every pattern (``(x + y) - y``, ``x - (x + y)``, ...), since
TIR's simplifier cancels structurally equal operands.  NaN results compare as NaN: IEEE
754 leaves the payload and sign of an operation's NaN open.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tvm
from tvm import relax, te, tirx

import aicf_tvm
from aicf_tvm.runtime.targets import resolve_target
from schedules.cpu.codegen import codegen_target
from schedules.cpu.ieee_arith import IEEEArithmetic, accumulated_products, ieee_arithmetic
from schedules.cpu.parallel_guard import tir_pipeline

SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -5e-39, 3e38, -3e38, 1.0, -1.0,
                     12582912.0, 0.1, 3.0, 1e10], np.float32)
OPS = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}
RELAX_OPS = {"+": relax.op.add, "-": relax.op.subtract, "*": relax.op.multiply, "/": relax.op.divide}


def leaf_patterns(n: int) -> list[tuple[int, ...]]:
    """Every way to fill ``n`` leaves up to renaming the variables: (0, 0, 1), (0, 1, 0), ..."""
    out: list[tuple[int, ...]] = []

    def grow(prefix: tuple[int, ...]) -> None:
        if len(prefix) == n:
            out.append(prefix)
            return
        for v in range(max(prefix, default=-1) + 2):
            grow((*prefix, v))

    grow(())
    return out


def shapes(ops: int):
    """Expression trees with ``ops`` binary operations; leaves numbered left to right."""
    if ops == 0:
        yield "leaf"
        return
    for left in range(ops):
        for a, b in itertools.product(shapes(left), shapes(ops - 1 - left)):
            for op in OPS:
                yield (op, a, b)


def fill(shape, leaves: list):
    """``shape`` with its leaves replaced, in order, by ``leaves`` (consumed)."""
    if shape == "leaf":
        return leaves.pop(0)
    op, a, b = shape
    return (op, fill(a, leaves), fill(b, leaves))


def count_leaves(shape) -> int:
    return 1 if shape == "leaf" else count_leaves(shape[1]) + count_leaves(shape[2])


def expressions(ops: int, constant: bool = False, per_shape: int | None = None) -> list:
    """Every shape with every leaf pattern (``per_shape``: that many, taken in turn, so that
    every pattern is used by some shapes); with ``constant``, the last variable of each
    pattern of two variables or more is the constant leaf ``"k"``."""
    out = []
    for n, s in enumerate(shapes(ops)):
        patterns = leaf_patterns(count_leaves(s))
        if per_shape is not None:
            patterns = [patterns[(n * per_shape + j) % len(patterns)] for j in range(per_shape)]
        for p in patterns:
            if constant:
                if max(p) == 0:
                    continue
                p = tuple("k" if v == max(p) else v for v in p)
            out.append(fill(s, list(p)))
    return out


def evaluate(expr, leaf) -> object:
    if not isinstance(expr, tuple):
        return leaf(expr)
    op, a, b = expr
    return OPS[op](evaluate(a, leaf), evaluate(b, leaf))


def operands(count: int) -> list[np.ndarray]:
    """``count`` arrays that together hold every combination of the specials (for
    ``count`` > 3 the fourth and later rotate the first three)."""
    grid = np.stack(np.meshgrid(*[SPECIALS] * min(count, 3), indexing="ij")).reshape(min(count, 3), -1)
    out = list(grid)
    for i in range(3, count):
        out.append(np.roll(out[i % 3], 7 * i))
    return [np.ascontiguousarray(a, np.float32) for a in out]


def assert_same(got: np.ndarray, want: np.ndarray, what: object) -> None:
    differ = (got.view(np.uint32) != want.view(np.uint32)) & ~(np.isnan(got) & np.isnan(want))
    assert not differ.any(), f"{what}: {got[differ][:4]} where {want[differ][:4]} is right"


def relax_module(exprs: list, constants: dict[int, float], count: int) -> tvm.IRModule:
    """One Relax function returning every expression (leaf i: input i, or a rank-0 constant)."""
    n = len(operands(count)[0])
    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType((n,), "float32")) for i in range(count)]

    def emit(expr):
        if not isinstance(expr, tuple):
            if expr in constants:
                return relax.const(np.float32(constants[expr]))
            return params[expr]
        op, a, b = expr
        return bb.emit(RELAX_OPS[op](emit(a), emit(b)))

    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(relax.Tuple([emit(e) for e in exprs]))
        bb.emit_func_output(out)
    return bb.get()


def run_default_build(mod: tvm.IRModule, args: list[np.ndarray]) -> list[np.ndarray]:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    result = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    return [result.numpy()] if hasattr(result, "numpy") else [t.numpy() for t in result]


@pytest.mark.parametrize("constant", [None, 12582912.0, -0.0])
def test_two_op_expressions_in_fused_kernels_round_like_the_graph(constant):
    """Every two-op shape and leaf pattern (with ``constant``, the last variable a rank-0
    constant), compiled by us, against numpy and TVM's default build (which cannot build a
    division by a constant zero: its constant folding raises)."""
    exprs = expressions(2, constant is not None)
    constants = {} if constant is None else {"k": constant}
    mod = relax_module(exprs, constants, 3)
    args = operands(3)
    model = aicf_tvm.compile(mod)
    if constant is None:  # one fused kernel per expression (with constants some fold away)
        assert [k.kind for k in model.kernels] == ["fused_elementwise"] * len(exprs)
    got = model(*args)
    with np.errstate(all="ignore"):
        for expr, out in zip(exprs, got):
            leaf = (lambda v: np.float32(constants[v]) if v in constants else args[v])
            assert_same(out, evaluate(expr, leaf), expr)
    if constant != 0.0:
        for expr, out, want in zip(exprs, got, run_default_build(mod, args)):
            assert_same(out, want, expr)


def _kernel_module(exprs: list, n: int, constants: dict) -> tvm.IRModule:
    """One PrimFunc computing every expression in a vectorized loop, as a fused kernel has
    it once a schedule has inlined the chain: the whole expression in one store.  Built
    from TIR nodes directly: ``te.create_prim_func`` would simplify ``x - x`` itself."""
    lanes = 16
    dtype = "float32"
    buffers = [tirx.decl_buffer((n,), dtype, name=f"b{i}") for i in range(4 + len(exprs))]
    outer, inner = tirx.Var("i", "int32"), tirx.Var("j", "int32")
    index = outer * lanes + inner
    nodes = {"+": tirx.Add, "-": tirx.Sub, "*": tirx.Mul, "/": tirx.Div}

    def value(expr):
        if not isinstance(expr, tuple):
            if expr in constants:  # an immediate, built without constant folding
                return tirx.FloatImm(dtype, constants[expr])
            return tirx.BufferLoad(buffers[expr], [index])
        op, a, b = expr
        return nodes[op](value(a), value(b))

    stores = [tirx.BufferStore(buffers[4 + k], value(e), [index]) for k, e in enumerate(exprs)]
    body = tirx.For(outer, 0, n // lanes, tirx.ForKind.SERIAL,
                    tirx.For(inner, 0, lanes, tirx.ForKind.VECTORIZED, tirx.SeqStmt(stores)))
    func = tirx.PrimFunc(buffers, body)
    return tvm.IRModule({"main": func.with_attrs({"tirx.noalias": True, "global_symbol": "main"})})


def _build_kernels(mod: tvm.IRModule, seal: bool):
    target = resolve_target("llvm")
    with target:
        if seal:
            mod = IEEEArithmetic(target)(mod)
    return tvm.compile(mod, target=codegen_target(target), tir_pipeline=tir_pipeline())


def _check_three_op(constants: dict, seal: bool = True, per_shape: int | None = 2,
                    limit: int | None = None) -> None:
    """Every three-op shape (``per_shape`` leaf patterns each; None: all 15)."""
    exprs = expressions(3, bool(constants), per_shape)[:limit]
    args = [a[: len(a) // 16 * 16] for a in operands(4)]  # whole vectors
    n = len(args[0])
    chunk = 160
    for start in range(0, len(exprs), chunk):
        part = exprs[start:start + chunk]
        lib = _build_kernels(_kernel_module(part, n, constants), seal)
        outs = [tvm.runtime.tensor(np.zeros(n, np.float32)) for _ in part]
        lib(*[tvm.runtime.tensor(a) for a in args], *outs)
        with np.errstate(all="ignore"):
            for expr, out in zip(part, outs):
                want = evaluate(expr, lambda v: np.float32(constants[v]) if v in constants else args[v])
                assert_same(out.numpy(), want, expr)


def test_three_op_expressions_in_one_kernel_round_like_numpy():
    """Every three-op shape and leaf pattern, in vectorized kernels, against numpy."""
    _check_three_op({})


def test_three_op_expressions_with_an_immediate_round_like_numpy():
    """The fourth variable as an immediate (TVM's builders fold immediates; the rounding
    magic number is what ``(x + c) - c`` rounds with)."""
    _check_three_op({"k": 12582912.0})


def test_without_the_pass_the_simplifier_cancels():
    """The reason for the pass: the same kernels built without it give wrong results, or
    do not build (the simplifier folds ``x / (k - k)`` to a division by zero and raises)."""
    with pytest.raises(AssertionError):
        _check_three_op({"k": 12582912.0}, seal=False, limit=40)
    with pytest.raises(tvm.error.InternalError, match="Divide by zero"):
        _check_three_op({"k": 12582912.0}, seal=False)


def _contains(func: tirx.PrimFunc, name: str) -> bool:
    return name in func.script()


def test_dot_product_accumulation_stays_contractible():
    """A matmul's ``C = C + A * B`` stays plain in a matmul kernel (free to become an FMA,
    as the op's contract allows); the same update in a ``sum`` kernel is sealed."""
    a = te.placeholder((8, 16), "float32", name="a")
    b = te.placeholder((16, 4), "float32", name="b")
    k = te.reduce_axis((0, 16), name="k")
    c = te.compute((8, 4), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    func = te.create_prim_func([a, b, c])
    assert len(accumulated_products(func)) == 2  # the update and its product
    as_matmul = ieee_arithmetic(func.with_attr("aicf.kind", "fused_gemm_bias_act"))
    as_sum = ieee_arithmetic(func.with_attr("aicf.kind", "fused_reduce_epilogue"))
    assert not _contains(as_matmul, "ieee_mul") and not _contains(as_matmul, "ieee_add")
    assert _contains(as_sum, "ieee_mul") and _contains(as_sum, "ieee_add")


def test_floor_mod_is_not_contracted():
    """float32 floor_mod(x, y) = x - floor(x / y) * y with two roundings: an FMA gave 256
    for floor_mod(1e10, 3) and 1e31 for floor_mod(3.4e38, 3)."""
    x = np.array([1e10, 3.4e38, 7.5, -7.5, 1e-45, np.inf] * 3, np.float32)
    y = np.array([3.0, 3.0, 2.0, 2.0, 3.0, 2.0] * 3, np.float32)
    bb = relax.BlockBuilder()
    params = [relax.Var(n, relax.TensorType((18,), "float32")) for n in "xy"]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(relax.op.floor_mod(*params))
        bb.emit_func_output(out)
    mod = bb.get()
    got = aicf_tvm.compile(mod)(x, y)
    with np.errstate(all="ignore"):
        want = x - np.floor(x / y) * y  # numpy: one rounding per op
    assert_same(got, want, "floor_mod")
    assert_same(got, run_default_build(mod, [x, y])[0], "floor_mod")


def test_rounding_trick_through_from_torch():
    """PyTorch's float32 ``(x + 1.5 * 2^23) - 1.5 * 2^23`` rounds x to an integer (ties to
    even); the fused kernel returned x unrounded."""
    torch = pytest.importorskip("torch")

    class RoundTrick(torch.nn.Module):
        def forward(self, x, y):
            return (x + 12582912.0) - 12582912.0 + (x + y) - y

    rng = np.random.default_rng(4)
    x = (rng.standard_normal((4, 64)) * 100).astype(np.float32)
    x[0, :6] = [2.5, 3.5, -2.5, 0.49999997, 1e30, -0.0]
    y = (rng.standard_normal((4, 64)) * 1e6).astype(np.float32)
    model = aicf_tvm.compile(aicf_tvm.from_torch(RoundTrick(), (torch.from_numpy(x), torch.from_numpy(y))))
    want = RoundTrick()(torch.from_numpy(x), torch.from_numpy(y)).numpy()
    assert_same(model(x, y), want, "rounding trick")


def test_a_gemm_in_a_generic_group_stays_contractible():
    """A matmul the GEMM rule scheduled inside a generic group (LLaMA's gate projection with
    its SwiGLU epilogue is a ``fused_reduce_epilogue``) keeps its multiply-accumulate plain
    (sealed, it lost FMA and the panel prefetch: LLaMA ran 1.55x slower); a sum of
    ``x * x`` there (an RMS norm) stays sealed."""
    a = te.placeholder((8, 16), "float32", name="a")
    b = te.placeholder((16, 4), "float32", name="b")
    k = te.reduce_axis((0, 16), name="k")
    c = te.compute((8, 4), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    r = te.reduce_axis((0, 16), name="r")
    sq = te.compute((8,), lambda i: te.sum(a[i, r] * a[i, r], axis=r), name="sq")
    func = te.create_prim_func([a, b, c, sq]).with_attrs(
        {"aicf.kind": "fused_reduce_epilogue", "aicf.schedule": "Gemm"})
    sealed = ieee_arithmetic(func).script()
    assert "c[v_i, v_j] = c[v_i, v_j] + a[v_i, v_k] * b[v_k, v_j]" in sealed
    assert "T.aicf.ieee_add(sq[v_i], T.aicf.ieee_mul(a[v_i, v_r], a[v_i, v_r]))" in sealed
