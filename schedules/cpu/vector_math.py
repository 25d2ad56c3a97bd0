"""Vectorizable float32 exp, erf, tanh, sigmoid, log and integer powers for LLVM CPU targets.

TVM lowers ``tirx.exp``/``tirx.log`` (and ``sigmoid``/``tanh``, which it expands into
exp) to ``llvm.exp``/``llvm.log`` and ``tirx.erf`` to a call of ``erff``.  The TVM build
links no vector math library, so LLVM's x86 backend splits every vector of them into one
libm call per lane: a GEMM with a GELU epilogue spent more time in ``erff`` than in the
GEMM.  ``VectorizeMath`` replaces each scalar float32 call of these functions in a
PrimFunc by a branch-free TIR expression (arithmetic, ``fma``, ``floor``, ``select``, bit
casts), which the loop vectorizer turns into SIMD code like any other arithmetic.

Each expression works in float64 on the float32 argument (exact: every float32 is a
float64) and rounds once to float32 at the end, so its error is half an ulp of float32
from that final rounding plus the float64 approximation error (relative 5e-12 for
exp/sigmoid/tanh/log, 7e-11 for erf).  The maximum errors, measured over all 2^32 float32
inputs against a float64 reference (``scripts/sweep_vector_math.py``), are ``ULP_BOUNDS``;
docs/numerics.md sets them beside glibc 2.36's (expf 0.5016, erff 0.9679, tanhf 2.1886,
logf 0.8177 ulp) and TVM's tanh and sigmoid formulas.  None is less accurate than the
libm function (or TVM expansion) it replaces, so the rewrite keeps an Emit's ``exact``
math tag.  Special values follow C99 Annex F: NaN in,
NaN out; exp(-inf) = 0, exp(inf) = inf, overflow to inf and gradual underflow to
subnormals; erf(±inf) = tanh(±inf) = ±1, erf(-0) = tanh(-0) = -0; sigmoid(-inf) = 0,
sigmoid(inf) = 1; log(±0) = -inf, log(x < 0) = NaN, log(inf) = inf.  Arguments are
clamped before any step that could overflow, so no intermediate makes a NaN.

Where: every such call inside a vectorized loop; erf and tanh also in scalar code
(``EVERYWHERE``), while exp, log and sigmoid outside vector loops stay libm calls, which
are faster in scalar code.  The rewrite is local to the PrimFuncs it is applied to (TVM's intrinsic
lowering rules are left as they are).  The CPU schedule rules count on it: they vectorize
loops whose only math calls are ones ``expands`` accepts (``elementwise.calls_scalar_math``),
and ``aicf_tvm.driver.pipeline.schedule`` (and the tuning build) runs ``VectorizeMath`` after
scheduling.  After, not before: inlining would copy one ``Let`` binding into two places.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import tvm
import tvm_ffi
from tvm import ir, tirx
from tvm.ir import Expr
from tvm.target import Target
from tvm.tirx.op import fma

from aicf_tvm.core.numerics import is_relaxed

from . import relaxed_math
from .llvm_pass import llvm_prim_func_pass
from .tir_exprs import let, nan_through

F32, F64 = "float32", "float64"

# 1 / ln 2 and ln 2
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
SQRT2 = 1.4142135623730951

# Coefficients, lowest degree first, from ``scripts/fit_vector_math.py`` (near-minimax).
# exp(r) = 1 + r + r^2 Q(r), expm1(r) = r + r^2 Q(r) on |r| <= ln2/2: relative error 5.2e-12.
EXP_Q = (0.5000000000104896, 0.16666666753872486, 0.0416666659549899, 0.008333289142324122,
         0.0013888985088819211, 0.00019904845734111312, 2.4796383061155893e-05)
# erf(x) = x P(x^2) on |x| <= 4: relative error 6.5e-11.
ERF_P = (1.128379167034157, -0.3761263862448047, 0.11283789511938189, -0.026866102927444218,
         0.00522386343820459, -0.0008547133492989014, 0.00012046914650125414,
         -1.488328675971629e-05, 1.6303989478233933e-06, -1.59155361894306e-07,
         1.380776464153986e-08, -1.0532854930715416e-09, 6.939154115851697e-11,
         -3.856058631748523e-12, 1.7565476298567984e-13, -6.335631960934116e-15,
         1.7290674734738658e-16, -3.3381422400254946e-18, 4.0473723047900083e-20,
         -2.3110757114299784e-22)
# log(m) = 2s + s z P(z), s = (m-1)/(m+1), z = s^2 <= 0.0295: relative error 3.0e-14.
LOG_P = (0.6666666667589931, 0.3999999558433356, 0.2857211352307913, 0.22175991280607155,
         0.19587195034744337)

# Beyond these |x| the float32 result is the limit (erf(x) and tanh(x) round to ±1).
ERF_CLAMP = 4.0  # erfc(4) = 1.5e-8 < 2^-25
TANH_CLAMP = 10.0  # 1 - tanh(10) = 4.1e-9 < 2^-25
EXP_CLAMP = 150.0  # exp(150) overflows float32, exp(-150) underflows it; 2^k stays a normal double


def c64(value: float) -> tirx.FloatImm:
    return tirx.FloatImm(F64, value)


def horner(x: Expr, coeffs: tuple[float, ...]) -> Expr:
    """sum(c_i x^i) by Horner's rule with fused multiply-adds."""
    acc: Expr = c64(coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = fma(acc, x, c64(c))
    return acc


def estrin(x: Expr, coeffs: tuple[float, ...]) -> Expr:
    """sum(c_i x^i) by Estrin's scheme with fused multiply-adds: pairs ``c_2i + c_2i+1 x``,
    then pairs of those in ``x^2``, ``x^4``, ...  Its dependent chain is about log2(n)
    steps where Horner's is n, which is what a vector loop waits on (erf's 20 terms)."""
    def level(power: tirx.Var, terms: list[Expr]) -> Expr:
        pairs = [fma(terms[i + 1], power, terms[i]) if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
        if len(pairs) == 1:
            return pairs[0]
        return let(power * power, lambda square: level(square, pairs), "p")

    return let(x, lambda x: level(x, [c64(c) for c in coeffs]), "t")


def clamp(x: Expr, lo: float, hi: float) -> Expr:
    return tirx.Min(tirx.Max(x, c64(lo)), c64(hi))


# 2^52 + 2^51 + 1023: a float64 of this binade has integer spacing, so ``fma(z, LOG2E,
# ROUNDER)`` rounds z log2(e) to the nearest integer k and holds k + 1023 in its low bits
# (two's complement, |k| < 2^50), which shifted left by 52 are the bits of 2^k.
ROUNDER = 6755399441056767.0


def exp_parts(z: Expr, body: Callable[[Expr, Expr], Expr]) -> Expr:
    """``body(scale, em)`` with e^z = scale * (1 + em), scale = 2^k, |em| <= 0.42 (|z| <= 150).

    k = round(z log2 e) and 2^k from one fused multiply-add (``ROUNDER``); z = k ln2 + r,
    |r| <= ln2/2, in one more: for |k| <= 217 its error (that of ln 2 in float64, and one
    rounding) is below 6e-15 absolute, far under the 5e-12 of ``em`` = expm1(r), whose
    polynomial runs by Estrin's scheme.  A vector loop of exp waits on this chain: with
    ``floor``, a float-to-integer conversion, Cody-Waite's two-step reduction and Horner's
    rule it was twice as long.
    """
    def rounded(t: tirx.Var) -> Expr:
        k = t - c64(ROUNDER)
        scale = tirx.reinterpret(F64, tirx.shift_left(tirx.reinterpret("int64", t), tirx.IntImm("int64", 52)))
        return let(fma(k, c64(-LN2), z), lambda r: body(scale, fma(r * r, estrin(r, EXP_Q), r)), "r")

    return let(fma(z, c64(LOG2E), c64(ROUNDER)), rounded, "t")


def exp64(z: Expr) -> Expr:
    """e^z in float64 for a float64 ``z`` (clamped to +-EXP_CLAMP: no overflow inside)."""
    return exp_parts(clamp(z, -EXP_CLAMP, EXP_CLAMP), lambda scale, em: scale * (c64(1.0) + em))


def exp(x: Expr) -> Expr:
    """float32 e^x: double-precision evaluation, one final rounding.  The argument is
    clamped in float32 by selects that pass NaN through (NaN compares false), and a NaN
    stays NaN through every step, so no select of the result is needed."""
    def body(x: tirx.Var) -> Expr:
        lo, hi = tirx.FloatImm(F32, -EXP_CLAMP), tirx.FloatImm(F32, EXP_CLAMP)
        clamped = tirx.Select(x < lo, lo, tirx.Select(x > hi, hi, x))
        return tirx.Cast(F32, exp_parts(tirx.Cast(F64, clamped), lambda scale, em: scale * (c64(1.0) + em)))

    return let(x, body, "x")


def sigmoid(x: Expr) -> Expr:
    """float32 1 / (1 + e^-x); sigmoid(-inf) = 0, sigmoid(inf) = 1, sigmoid(-100) a subnormal."""
    def body(x: tirx.Var) -> Expr:
        return nan_through(x, tirx.Cast(F32, c64(1.0) / (c64(1.0) + exp64(-tirx.Cast(F64, x)))))

    return let(x, body, "x")


def erf(x: Expr) -> Expr:
    """float32 erf(x) = x P(x^2) in double on |x| <= 4, ±1 beyond."""
    def body(x: tirx.Var) -> Expr:
        def odd(a: tirx.Var) -> Expr:
            return tirx.Cast(F32, a * estrin(a * a, ERF_P))

        return nan_through(x, let(clamp(tirx.Cast(F64, x), -ERF_CLAMP, ERF_CLAMP), odd, "a"))

    return let(x, body, "x")


def tanh(x: Expr) -> Expr:
    """float32 tanh(x) = copysign(q / (q + 2), x), q = expm1(2|x|).

    expm1 keeps the relative accuracy for tiny |x|, where e^2x - 1 would cancel.
    """
    def expm1_ratio(scale: Expr, em: Expr) -> Expr:
        q = fma(scale, em, scale - c64(1.0))  # 2^k (1 + em) - 1
        return let(q, lambda q: q / (q + c64(2.0)), "q")

    def body(x: tirx.Var) -> Expr:
        xd = tirx.Cast(F64, x)
        two_a = c64(2.0) * tirx.Min(tirx.abs(xd), c64(TANH_CLAMP))
        return nan_through(x, tirx.Cast(F32, tirx.copysign(exp_parts(two_a, expm1_ratio), xd)))

    return let(x, body, "x")


def log(x: Expr) -> Expr:
    """float32 ln(x) from x = 2^e m, m in [sqrt(1/2), sqrt(2)).

    Subnormal float32 inputs are normal float64 numbers, so they need no rescaling.
    """
    mantissa, one_bits = tirx.IntImm("int64", (1 << 52) - 1), tirx.IntImm("int64", 1023 << 52)

    def from_bits(bits: tirx.Var) -> Expr:
        biased = tirx.shift_right(bits, tirx.IntImm("int64", 52))
        e = tirx.Cast(F64, biased - tirx.IntImm("int64", 1023))
        m = tirx.reinterpret(F64, tirx.bitwise_or(tirx.bitwise_and(bits, mantissa), one_bits))

        def reduced(m: tirx.Var) -> Expr:
            big = m > c64(SQRT2)
            mm = tirx.Select(big, m * c64(0.5), m)
            ee = tirx.Select(big, e + c64(1.0), e)

            def series(s: tirx.Var) -> Expr:
                z = s * s
                return fma(ee, c64(LN2), fma(s * z, horner(z, LOG_P), c64(2.0) * s))

            return let((mm - c64(1.0)) / (mm + c64(1.0)), series, "s")

        return let(m, reduced, "m")

    def body(x: tirx.Var) -> Expr:
        y = tirx.Cast(F32, let(tirx.reinterpret("int64", tirx.Cast(F64, x)), from_bits, "bits"))
        zero, inf = tirx.FloatImm(F32, 0.0), tirx.FloatImm(F32, float("inf"))
        finite_positive = tirx.all(x > zero, x < inf)
        special = tirx.Select(tirx.EQ(x, zero), -inf,
                              tirx.Select(x < zero, tirx.FloatImm(F32, float("nan")), x))
        return tirx.Select(finite_positive, y, special)

    return let(x, body, "x")


POW_EXPONENTS = (-4, -3, -2, -1, 1, 2, 3, 4)


def int_exponent(y: Expr) -> int | None:
    """The exponent of ``pow(x, y)`` when it is a float constant in ``POW_EXPONENTS``."""
    if isinstance(y, tirx.FloatImm) and float(y.value).is_integer() and int(y.value) in POW_EXPONENTS:
        return int(y.value)
    return None


def power(x: Expr, n: int) -> Expr:
    """float32 pow(x, n) for a small integer n: x^|n| in float64, inverted for n < 0.

    For float32 x, x^2 is exact in float64 (48 significant bits) and x^3, x^4 cost one
    float64 rounding, 1/x^|n| one more: the result is within 0.5 + 2^-27 ulp after the
    final rounding, more accurate than glibc's powf (documented 0.82 ulp). float32 x^4
    neither overflows nor leaves the normal range in float64, so the final rounding alone
    decides overflow to inf and underflow. C99 Annex F cases come out of the arithmetic:
    NaN in, NaN out; pow(-0, 3) = -0, pow(-inf, 3) = -inf, pow(±0, -n) = inf with the sign
    of x for odd n, pow(±inf, -n) = ±0 likewise.
    """
    def body(x: tirx.Var) -> Expr:
        xd = tirx.Cast(F64, x)
        square = xd * xd
        magnitude = {1: xd, 2: square, 3: square * xd, 4: square * square}[abs(n)]
        return tirx.Cast(F32, magnitude if n > 0 else c64(1.0) / magnitude)

    return let(x, body, "x")


# Maximum error over all 2^32 float32 inputs (scripts/sweep_vector_math.py, docs/numerics.md).
# Measured: exp 0.500023, erf 0.500912 (Estrin; Horner's 0.500908), tanh 0.500076, sigmoid 0.500021, log 0.500000.
ULP_BOUNDS = {"exp": 0.5001, "erf": 0.5010, "tanh": 0.5001, "sigmoid": 0.5001, "log": 0.5001}

EXPANSIONS: dict[str, Callable[[Expr], Expr]] = {
    "tirx.exp": exp, "tirx.erf": erf, "tirx.tanh": tanh, "tirx.sigmoid": sigmoid, "tirx.log": log,
}


# Expanded in scalar code too: a glibc erff call costs more than the expansion even
# unvectorized, and TVM's tanh formula loses all precision near 0 and the sign of -0.
# exp, log and sigmoid stay libm calls outside vector loops: in a serial loop LLVM cannot
# vectorize (a float sum), their scalar expansion is slower than libm.
# pow with a small integer exponent is a few multiplies, far cheaper than a powf call.
EVERYWHERE = frozenset({"tirx.erf", "tirx.tanh", "tirx.pow"})


def expands(call: ir.Call) -> bool:
    """Whether ``VectorizeMath`` replaces this call inside a vectorized loop (a scalar
    float32 call of ``EXPANSIONS``, or ``pow`` by a constant in ``POW_EXPONENTS``)."""
    if not (isinstance(call.op, ir.Op) and str(call.ty) == F32):
        return False
    if call.op.name == "tirx.pow":
        return len(call.args) == 2 and int_exponent(call.args[1]) is not None
    return call.op.name in EXPANSIONS and len(call.args) == 1


def _expand_calls(node: object, names: frozenset[str], table: Mapping[str, Callable[[Expr], Expr]]) -> object:
    def rewrite(call: ir.Call) -> Expr:
        if expands(call) and call.op.name in names:
            if call.op.name == "tirx.pow":
                return power(call.args[0], int_exponent(call.args[1]))
            return table[call.op.name](call.args[0])
        return call

    return tvm_ffi.structural_map(node, (ir.Call, rewrite))


def vectorize_math(func: tirx.PrimFunc, relaxed: bool | None = None) -> tirx.PrimFunc:
    """``func`` with the calls ``expands`` accepts replaced by their TIR expansion: all of
    them inside vectorized loops, the ``EVERYWHERE`` ones in any loop.  ``relaxed`` (None:
    whether ``func`` is at the ``relaxed`` numeric level, ``is_relaxed``) takes the float32
    evaluations of ``relaxed_math`` for exp, sigmoid and tanh inside vector loops."""
    relaxed = is_relaxed(func) if relaxed is None else relaxed
    vector_table = {**EXPANSIONS, **relaxed_math.EXPANSIONS} if relaxed else EXPANSIONS

    def in_vector_loop(loop: tirx.For) -> tirx.For:
        if loop.kind == tirx.ForKind.VECTORIZED:
            return _expand_calls(loop, frozenset(EXPANSIONS) | EVERYWHERE, vector_table)
        return loop

    return _expand_calls(tvm_ffi.structural_map(func, (tirx.For, in_vector_loop)), EVERYWHERE, EXPANSIONS)


def VectorizeMath(target: Target | None = None) -> tvm.transform.Pass:
    """PrimFunc pass applying ``vectorize_math`` to the PrimFuncs compiled for an LLVM target.

    The target is the PrimFunc's ``target`` attr, else ``target``, else the enclosing
    ``with target:``; other targets (CUDA has its own vector math) are left alone.
    """
    return llvm_prim_func_pass(vectorize_math, target, "VectorizeMath")