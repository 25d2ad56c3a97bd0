"""VectorizeMath: float32 exp/erf/tanh/sigmoid/log as vectorizable TIR arithmetic.

Every function is compiled the way the pipeline runs it (a vectorized loop, then
``vectorize_math``) and checked against the float64 function of numpy/scipy: the ulp
error on a dense sample (random bit patterns: subnormals, huge values, infinities, NaNs;
plus the function's working range), C99 special values, and the LLVM IR of fused
kernels, which must not call libm per lane.  The full 2^32 sweep is
``scripts/sweep_vector_math.py``.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.special
import tvm
from tvm import relax, te, tirx
from tvm.script import tirx as T
from tvm.target import Target

import aicf_tvm
from aicf_tvm.driver.pipeline import run_pipeline
from schedules.cpu import Elementwise, relaxed_math
from schedules.cpu.vector_math import POW_EXPONENTS, ULP_BOUNDS, VectorizeMath, vectorize_math

TARGET = Target({**Target.from_device(tvm.cpu()).export(), "num-cores": 2})
N = (1 << 20) + 1024  # the dense sample and its special values
REFERENCE = {
    "exp": np.exp, "erf": scipy.special.erf, "tanh": np.tanh, "sigmoid": scipy.special.expit,
    "log": np.log,
}
WORKING_RANGE = {"exp": (-110, 95), "erf": (-5, 5), "tanh": (-12, 12), "sigmoid": (-110, 95),
                 "log": (0, 100)}
LIBM_CALL = re.compile(r"@(erff|expf|tanhf|logf|llvm\.exp\.\S+|llvm\.log\.\S+)\(")
_KERNELS: dict[tuple[str, bool], tvm.runtime.Module] = {}


def kernel(name: str, relaxed: bool = False):
    """y = f(x) over N floats, vectorized by 16 and expanded, as the CPU rules build it
    (``relaxed``: at the relaxed numeric level, ``relaxed_math``'s float32 forms)."""
    if (name, relaxed) not in _KERNELS:
        a = te.placeholder((N,), "float32", name="a")
        out = te.compute((N,), lambda i: getattr(tirx, name)(a[i]), name="y")
        sch = tvm.s_tir.Schedule(te.create_prim_func([a, out]))
        (loop,) = sch.get_loops(sch.get_sblock("y"))
        outer, inner = sch.split(loop, [None, 16])
        sch.parallel(outer)
        sch.vectorize(inner)
        func = vectorize_math(sch.mod["main"], relaxed=relaxed)
        _KERNELS[name, relaxed] = tvm.compile(tvm.IRModule({"main": func}), target=TARGET)
    return _KERNELS[name, relaxed]


def evaluate(name: str, x: np.ndarray, relaxed: bool = False) -> np.ndarray:
    padded = np.resize(x.astype(np.float32), N)
    out = tvm.runtime.tensor(np.empty(N, np.float32))
    kernel(name, relaxed).mod["main"](tvm.runtime.tensor(padded), out)
    return out.numpy()[: len(x)]


def ulp_error(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|y - ref| in float32 ulps of the float64 ``ref``; inf when NaN-ness differs.

    An infinite ``y`` counts as ±2^128; where ``ref`` rounds to an infinity, that infinity
    is exact.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        ref32 = ref.astype(np.float32)
        yd = y.astype(np.float64)
    _, exponent = np.frexp(ref)
    ulp = np.ldexp(1.0, np.maximum(np.where(ref == 0, -1000, exponent) - 24, -149))
    overflow = np.isinf(ref32) & np.isfinite(ref)
    ulp = np.where(overflow, 2.0**104, ulp)
    yd = np.where(np.isinf(yd) & ~overflow & ~np.isinf(ref), np.copysign(2.0**128, yd), yd)
    with np.errstate(invalid="ignore"):
        err = np.abs(yd - ref) / ulp
    err = np.where((overflow | np.isinf(ref)) & (y == ref32), 0.0, err)
    err = np.where(np.isnan(ref) & np.isnan(y), 0.0, err)
    return np.where(np.isnan(ref) != np.isnan(y), np.inf, err)


def dense_sample(name: str, rng: np.random.Generator) -> np.ndarray:
    """~1e6 points: all float32 classes by random bit patterns, and the working range."""
    bits = rng.integers(0, 1 << 32, size=1 << 19, dtype=np.uint64).astype(np.uint32)
    bits = bits.view(np.float32)
    lo, hi = WORKING_RANGE[name]
    dense = rng.uniform(lo, hi, size=1 << 19).astype(np.float32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754944e-38,
                         3.4028235e38, -3.4028235e38], dtype=np.float32)
    return np.concatenate([bits, dense, specials])


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_ulp_error_within_documented_bound(name):
    """The sample's worst error stays within the bound measured by the full sweep."""
    x = dense_sample(name, np.random.default_rng(sorted(REFERENCE).index(name)))
    with np.errstate(all="ignore"):
        ref = REFERENCE[name](x.astype(np.float64))
    err = ulp_error(evaluate(name, x), ref)
    worst = int(np.argmax(err))
    assert err[worst] <= ULP_BOUNDS[name], f"{name}({x[worst]!r}): {err[worst]} ulp"


SPECIAL_CASES = {
    "exp": [(-np.inf, 0.0), (np.inf, np.inf), (88.8, np.inf), (-0.0, 1.0), (0.0, 1.0)],
    "erf": [(np.inf, 1.0), (-np.inf, -1.0), (-0.0, -0.0), (0.0, 0.0), (3.92, 1.0), (-30.0, -1.0)],
    "tanh": [(np.inf, 1.0), (-np.inf, -1.0), (-0.0, -0.0), (0.0, 0.0), (9.1, 1.0), (-3e38, -1.0)],
    "sigmoid": [(-np.inf, 0.0), (np.inf, 1.0), (-0.0, 0.5), (200.0, 1.0), (-200.0, 0.0)],
    "log": [(0.0, -np.inf), (-0.0, -np.inf), (np.inf, np.inf), (-1.0, np.nan), (-np.inf, np.nan),
            (1.0, 0.0)],
}


@pytest.mark.parametrize("name", sorted(SPECIAL_CASES))
def test_special_values_follow_c99(name):
    """Limits, signed zeros and NaN propagation (C99 Annex F), bit for bit."""
    x = np.array([c[0] for c in SPECIAL_CASES[name]] + [np.nan], dtype=np.float32)
    expected = np.array([c[1] for c in SPECIAL_CASES[name]] + [np.nan], dtype=np.float32)
    y = evaluate(name, x)
    np.testing.assert_array_equal(y, expected)
    np.testing.assert_array_equal(np.signbit(y[expected == 0]), np.signbit(expected[expected == 0]))


RELAXED = sorted(name.removeprefix("tirx.") for name in relaxed_math.EXPANSIONS)


@pytest.mark.parametrize("name", RELAXED)
def test_relaxed_ulp_error_within_documented_bound(name):
    """The relaxed level's float32 forms: the sample's worst error within the full sweep's
    bound, and more than half an ulp somewhere (they are the float32 evaluations, not the
    exact level's)."""
    x = dense_sample(name, np.random.default_rng(7 + RELAXED.index(name)))
    with np.errstate(all="ignore"):
        ref = REFERENCE[name](x.astype(np.float64))
    err = ulp_error(evaluate(name, x, relaxed=True), ref)
    worst = int(np.argmax(err))
    assert err[worst] <= relaxed_math.ULP_BOUNDS[name], f"{name}({x[worst]!r}): {err[worst]} ulp"
    assert err[worst] > 0.6


@pytest.mark.parametrize("name", RELAXED)
def test_relaxed_special_values_follow_c99(name):
    """The relaxed forms keep the exact level's limits, signed zeros and NaN, bit for bit."""
    x = np.array([c[0] for c in SPECIAL_CASES[name]] + [np.nan], dtype=np.float32)
    expected = np.array([c[1] for c in SPECIAL_CASES[name]] + [np.nan], dtype=np.float32)
    y = evaluate(name, x, relaxed=True)
    np.testing.assert_array_equal(y, expected)
    np.testing.assert_array_equal(np.signbit(y[expected == 0]), np.signbit(expected[expected == 0]))


def test_relaxed_exp_and_sigmoid_underflow_gradually():
    """Results in the subnormal range are subnormals, not 0: exp(-87.4 .. -103.9) and
    sigmoid of the same arguments, within the bound."""
    x = np.linspace(-103.9, -87.4, 4001, dtype=np.float32)
    for name in ("exp", "sigmoid"):
        y = evaluate(name, x, relaxed=True)
        assert (y > 0).all() and (y < np.finfo(np.float32).tiny).any()
        assert ulp_error(y, REFERENCE[name](x.astype(np.float64))).max() <= relaxed_math.ULP_BOUNDS[name]


def test_exp_underflows_gradually_into_subnormals():
    """exp of -87.4 .. -103.9 is a subnormal float32: correctly rounded, not flushed to 0."""
    x = np.linspace(-103.9, -87.4, 4001, dtype=np.float32)
    y = evaluate("exp", x)
    assert (y > 0).all() and (y < np.finfo(np.float32).tiny).any()
    assert ulp_error(y, np.exp(x.astype(np.float64))).max() <= ULP_BOUNDS["exp"]


def llvm_ir(executable) -> str:
    """The LLVM IR of a Relax executable's compiled kernels."""
    modules = [executable.mod, *executable.mod.imports]
    return "".join(m.inspect_source("ll") for m in modules if m.kind == "llvm")


def ffn(activation: str, rng: np.random.Generator) -> tuple[tvm.IRModule, np.ndarray, np.ndarray]:
    """act(x @ w + b) with constant weights; returns the module, an input and the
    float64 numpy/scipy reference output."""
    x = rng.standard_normal((32, 64)).astype(np.float32)
    w = (rng.standard_normal((64, 128)) * 0.3).astype(np.float32)
    b = rng.standard_normal(128).astype(np.float32)
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(xv, relax.const(w))), relax.const(b)))
            out = bb.emit_output(getattr(relax.op.nn, activation)(y))
        bb.emit_func_output(out)
    h = x.astype(np.float64) @ w + b
    expected = {
        "gelu": 0.5 * h * (1 + scipy.special.erf(h / np.sqrt(2))),
        "gelu_tanh": 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3))),
        "silu": h * scipy.special.expit(h),
    }[activation]
    return bb.get(), x, expected


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "silu"])
def test_gemm_epilogue_calls_no_libm(activation):
    """The fused GEMM + activation kernel computes erf/tanh/sigmoid in vector registers."""
    mod, x, expected = ffn(activation, np.random.default_rng(1))
    model = aicf_tvm.compile(mod, target=TARGET)
    assert [k.kind for k in model.kernels] == ["fused_gemm_bias_act"]
    ir = llvm_ir(model.executable)
    assert not LIBM_CALL.search(ir), LIBM_CALL.search(ir).group(0)
    assert "x double>" in ir  # the float64 evaluation runs on vectors
    np.testing.assert_allclose(model(x), expected, rtol=2e-5, atol=2e-5)


def test_without_the_pass_the_epilogue_calls_erff():
    """What the IR check above guards against: TVM's lowering makes an erff call."""
    mod, _, _ = ffn("gelu", np.random.default_rng(2))
    lowered = run_pipeline(mod, TARGET, until="schedule", vector_math=False).lowered
    ir = llvm_ir(tvm.compile(lowered, target=TARGET))
    assert LIBM_CALL.search(ir) is not None


def test_softmax_exp_is_vectorized():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 256)) * 4).astype(np.float32)
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [xv]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.softmax(xv, axis=-1))
        bb.emit_func_output(out)
    model = aicf_tvm.compile(bb.get(), target=TARGET)
    ir = llvm_ir(model.executable)
    assert not LIBM_CALL.search(ir)
    e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    np.testing.assert_allclose(model(x), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


def elementwise(op, dtype: str) -> tirx.PrimFunc:
    a = te.placeholder((64, 128), dtype, name="a")
    return te.create_prim_func([a, te.compute(a.shape, lambda i, j: op(a[i, j]), name="y")])


def test_elementwise_rule_vectorizes_only_what_the_pass_expands():
    """float32 exp becomes arithmetic after scheduling, so its loop is vectorized; sin and
    float64 exp stay libm calls, and their loops stay scalar."""
    scripts = {}
    for label, op, dtype in [("exp32", tirx.exp, "float32"), ("sin32", tirx.sin, "float32"),
                             ("exp64", tirx.exp, "float64")]:
        sch = Elementwise().apply(elementwise(op, dtype), TARGET, False)
        scripts[label] = sch.mod["main"].script()
    assert "T.vectorized" in scripts["exp32"]
    assert "T.vectorized" not in scripts["sin32"] and "T.vectorized" not in scripts["exp64"]


def vector_loop(op, dtype: str) -> tirx.PrimFunc:
    """y = op(a) over 64 x 128 with the inner loop vectorized by 16."""
    sch = tvm.s_tir.Schedule(elementwise(op, dtype))
    loop = sch.get_loops(sch.get_sblock("y"))[-1]
    sch.vectorize(sch.split(loop, [None, 16])[1])
    return sch.mod["main"]


def test_pass_leaves_other_dtypes_and_targets_alone():
    """float64 calls keep libm (it is float32 arithmetic); CUDA has its own math library."""
    exp64 = vector_loop(tirx.exp, "float64")
    assert vectorize_math(exp64).same_as(exp64)
    mod = tvm.IRModule({"main": vector_loop(tirx.exp, "float32")})
    cuda = VectorizeMath(Target({"kind": "cuda", "arch": "sm_90"}))(mod)
    tvm.ir.assert_structural_equal(cuda, mod)
    cpu = VectorizeMath(TARGET)(mod)
    assert "T.exp" not in cpu["main"].script() and "T.exp" in mod["main"].script()


def test_outside_vector_loops_only_erf_and_tanh_expand():
    """In scalar code libm's exp/log/sigmoid are faster than the expansion; glibc's erff
    is not, and TVM's tanh formula is inaccurate near 0 (docs/numerics.md)."""
    for op, expanded in [(tirx.exp, False), (tirx.log, False), (tirx.sigmoid, False),
                         (tirx.erf, True), (tirx.tanh, True)]:
        script = vectorize_math(elementwise(op, "float32")).script()
        assert (f"T.{op.__name__}(" not in script) == expanded, op.__name__


@T.prim_func(s_tir=True)
def _exp_twice(a: T.Buffer((16,), "float32"), b: T.Buffer((16,), "float32")):
    for i in T.vectorized(16):
        with T.sblock("y"):
            vi = T.axis.spatial(16, i)
            b[vi] = T.exp(a[vi]) + T.exp(T.exp(a[vi]))


def test_each_call_gets_its_own_bindings_and_nested_calls_expand():
    """Three calls (one nested): three expansions, each binding fresh variables."""
    expanded = vectorize_math(_exp_twice)
    assert "T.exp" not in expanded.script()
    tvm.ir.assert_structural_equal(vectorize_math(expanded), expanded)  # idempotent
    x = np.linspace(-3, 3, 16, dtype=np.float32)
    out = tvm.runtime.tensor(np.empty(16, np.float32))
    built = tvm.compile(tvm.IRModule({"main": expanded}), target=TARGET)
    built.mod["main"](tvm.runtime.tensor(x), out)
    xd = x.astype(np.float64)
    np.testing.assert_allclose(out.numpy(), np.exp(xd) + np.exp(np.exp(xd)), rtol=1e-6)


def power_kernel(n: float):
    """y = pow(x, n) over N floats, vectorized by 16 and expanded, as ``kernel`` builds."""
    key = f"pow{n}"
    if key not in _KERNELS:
        a = te.placeholder((N,), "float32", name="a")
        out = te.compute((N,), lambda i: tirx.power(a[i], tirx.const(n, "float32")), name="y")
        sch = tvm.s_tir.Schedule(te.create_prim_func([a, out]))
        (loop,) = sch.get_loops(sch.get_sblock("y"))
        sch.vectorize(sch.split(loop, [None, 16])[1])
        _KERNELS[key] = tvm.compile(tvm.IRModule({"main": vectorize_math(sch.mod["main"])}),
                                    target=TARGET)
    return _KERNELS[key]


@pytest.mark.parametrize("n", POW_EXPONENTS)
def test_integer_power_is_within_half_an_ulp_and_follows_c99(n):
    """pow(x, n) for |n| <= 4 against float64 numpy over every float32 class, with the
    signed zeros, infinities and NaN of C99 Annex F bit for bit."""
    rng = np.random.default_rng(100 + n)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4028235e38,
                         -3.4028235e38, 1.0, -1.0], dtype=np.float32)
    bits = rng.integers(0, 1 << 32, size=1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([bits, rng.uniform(-30, 30, 1 << 18).astype(np.float32), specials])
    padded = np.resize(x, N)
    out = tvm.runtime.tensor(np.empty(N, np.float32))
    power_kernel(float(n)).mod["main"](tvm.runtime.tensor(padded), out)
    y = out.numpy()[: len(x)]
    with np.errstate(all="ignore"):
        ref = np.power(x.astype(np.float64), float(n))
    err = ulp_error(y, ref)
    assert err.max() <= 0.5 + 2.0**-20, f"pow({x[int(np.argmax(err))]!r}, {n})"
    with np.errstate(all="ignore"):
        exact = np.power(specials.astype(np.float64), float(n)).astype(np.float32)
    got = y[-len(specials):]
    np.testing.assert_array_equal(got, exact)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(exact))
    assert not re.search(r"@(powf|llvm\.pow\.\S+)\(", llvm_ir(power_kernel(float(n))))


def test_only_small_integer_powers_expand():
    """pow by 3.0 becomes multiplies (in scalar code too); pow by 2.5 or by a tensor stays
    a libm call, and the Elementwise rule keeps that loop scalar."""
    cube = vectorize_math(elementwise(lambda x: tirx.power(x, tirx.const(3.0, "float32")), "float32"))
    assert "T.pow" not in cube.script()
    half = elementwise(lambda x: tirx.power(x, tirx.const(2.5, "float32")), "float32")
    assert "T.pow" in vectorize_math(half).script()
    assert "T.vectorized" not in Elementwise().apply(half, TARGET, False).mod["main"].script()
    cube_sch = Elementwise().apply(
        elementwise(lambda x: tirx.power(x, tirx.const(3.0, "float32")), "float32"), TARGET, False)
    assert "T.vectorized" in cube_sch.mod["main"].script()


def test_gelu_tanh_with_pow_runs_vectorized_without_powf():
    """GPT-2's GELU (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), x^3 as pow) compiles
    to vector code calling no libm, and matches PyTorch's float64 evaluation."""
    torch = pytest.importorskip("torch")

    class NewGelu(torch.nn.Module):
        def forward(self, x):
            return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * torch.pow(x, 3.0))))

    x = np.random.default_rng(7).standard_normal((64, 384)).astype(np.float32) * 3
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(NewGelu(), (torch.from_numpy(x),)), target="llvm")
    assert not re.search(r"@(powf|llvm\.pow\.\S+|tanhf)\(", llvm_ir(compiled.executable))
    ref = NewGelu()(torch.from_numpy(x).double()).numpy()
    np.testing.assert_allclose(compiled(x), ref, rtol=2e-6, atol=1e-6)
