"""float32 exp, sigmoid, tanh and erf evaluated in float32: the ``relaxed`` numeric level.

``vector_math``'s expansions (the ``exact`` level) evaluate in float64 and round once, so
every result is within 0.5001 ulp; that costs two float64 vectors per float32 vector, and
an attention over 1500 keys spent 28% of its time in the softmax's exp.  An Emit the user
put at the ``relaxed`` level (``CompileOptions(numerics="relaxed")``, docs/numerics.md)
gets these instead: the same reductions and special cases, evaluated in float32 with
fused multiply-adds, as the vectorized exp of PyTorch, ONNX Runtime and OpenVINO is.
Their maximum errors over all float32 inputs are ``ULP_BOUNDS`` (``python -m
scripts.sweep_vector_math --impls relaxed``).

* exp: Cody-Waite reduction ``x = k ln2 + r`` (|r| <= ln2/2, ln2 split in two float32 parts,
  each product exact inside its fma), ``e^r = 1 + r + r^2 P(r)`` with Cephes' degree-5
  ``P``, then ``2^k`` as two powers ``2^(k>>1) 2^(k - (k>>1))`` built from exponent bits, so
  that results in the subnormal range underflow gradually (one rounding, in the second
  product) and ``k = 128`` overflows to inf through the arithmetic;
* sigmoid: ``e = exp(-|x|)``, the result ``1 / (1 + e)`` for x >= 0 and ``e / (1 + e)``
  below (one division): no overflow of ``e`` (sigmoid(-100) is a subnormal, not 0);
* tanh: ``copysign(a + a z Q(z), x)``, a = |x|, z = a^2, for a < 0.625 (Cephes' polynomial:
  no cancellation near 0, tanh(-0) = -0), else ``copysign(1 - 2 / (e^(2a) + 1), x)``, a
  clamped at 10;
* erf: ``x (A(z) / B(z))``, z = x^2, the float32 rational of Eigen, XLA and TVM's own
  ``fast_erf`` (degree 13 over 8, one division; the quotient first, so a tiny x does not
  go through a subnormal ``x A(z)``), and ``copysign(1, x)`` from |x| >= 3.8325, where
  float32 erf rounds to 1 (the exact level's float64 polynomial is about a quarter of a
  GEMM + GELU kernel's time at K = 96). Its 6.1 ulp near |x| = 3.65 is an absolute error
  of 3.6e-7.

Special values as the exact level's (C99 Annex F): NaN in, NaN out; exp(-inf) = 0,
exp(inf) = inf; sigmoid(±inf) = 1 / 0; tanh(±inf) = ±1; erf(±inf) = ±1, erf(-0) = -0.
"""

from __future__ import annotations

from collections.abc import Callable

from tvm import tirx
from tvm.ir import Expr
from tvm.tirx.op import fma

from .tir_exprs import let, nan_through

F32 = "float32"

LOG2E = 1.44269504088896341
LN2_HI = 0.693359375  # 8 significant bits: k * LN2_HI is exact for |k| < 2^16
LN2_LO = -2.12194440e-4
# e^r = 1 + r + r^2 P(r) on |r| <= ln2/2 (Cephes expf), highest degree first
EXP_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
# tanh(x) = x + x z Q(z), z = x^2, |x| < 0.625 (Cephes tanhf), highest degree first
TANH_Q = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1)
# erf(x) = x A(x^2) / B(x^2) on [-4, 4] (Eigen's and XLA's float32 rational, TVM's
# ``fast_erf_float_expr``), highest degree first
ERF_ALPHA = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
             -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
ERF_BETA = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
            -1.42647390514189e-02)
ERF_ONE = 3.832506856900711  # erf(x) rounds to 1.0 in float32 from here on (XLA's clamp)
TANH_SMALL = 0.625
TANH_CLAMP = 10.0
EXP_LO, EXP_HI = -104.0, 89.0  # e^-104 rounds to 0, e^89 overflows: nothing beyond changes

# Maximum error over all 2^32 float32 inputs (scripts/sweep_vector_math.py --impls relaxed).
# Measured: exp 1.010350, sigmoid 2.401877, tanh 1.330320, erf 6.106001 (4294978571 inputs each).
ULP_BOUNDS = {"exp": 1.011, "sigmoid": 2.402, "tanh": 1.331, "erf": 6.107}


def c32(value: float) -> tirx.FloatImm:
    return tirx.FloatImm(F32, value)


def horner(x: Expr, coeffs: tuple[float, ...]) -> Expr:
    """sum(c_i x^(n-i)) for coefficients highest degree first, with float32 fmas."""
    acc: Expr = c32(coeffs[0])
    for c in coeffs[1:]:
        acc = fma(acc, x, c32(c))
    return acc


def pow2(k: Expr) -> Expr:
    """2^k (float32) for an int32 ``k`` in [-126, 127], from its exponent bits."""
    return tirx.reinterpret(F32, tirx.shift_left(k + tirx.IntImm("int32", 127), tirx.IntImm("int32", 23)))


def exp32(x: Expr) -> Expr:
    """e^x in float32 for a float32 ``x`` that is not NaN (clamped: no NaN inside)."""
    def reduced(xc: tirx.Var, k: tirx.Var) -> Expr:
        r = fma(k, c32(-LN2_LO), fma(k, c32(-LN2_HI), xc))

        def scaled(r: tirx.Var) -> Expr:
            er = fma(r * r, horner(r, EXP_P), r) + c32(1.0)
            ki = tirx.Cast("int32", k)
            half = tirx.shift_right(ki, tirx.IntImm("int32", 1))
            return er * pow2(half) * pow2(ki - half)

        return let(r, scaled, "r")

    def split(xc: tirx.Var) -> Expr:
        return let(tirx.floor(fma(xc, c32(LOG2E), c32(0.5))), lambda k: reduced(xc, k), "k")

    return let(tirx.Min(tirx.Max(x, c32(EXP_LO)), c32(EXP_HI)), split, "xc")


def exp(x: Expr) -> Expr:
    return let(x, lambda x: nan_through(x, exp32(x)), "x")


def sigmoid(x: Expr) -> Expr:
    def body(x: tirx.Var) -> Expr:
        def ratio(e: tirx.Var) -> Expr:
            return tirx.Select(x >= c32(0.0), c32(1.0), e) / (c32(1.0) + e)

        return nan_through(x, let(exp32(-tirx.abs(x)), ratio, "e"))

    return let(x, body, "x")


def tanh(x: Expr) -> Expr:
    def body(x: tirx.Var) -> Expr:
        def by_size(a: tirx.Var) -> Expr:
            z = a * a
            small = fma(a * z, horner(z, TANH_Q), a)
            e = exp32(c32(2.0) * tirx.Min(a, c32(TANH_CLAMP)))
            large = c32(1.0) - c32(2.0) / (e + c32(1.0))
            return tirx.copysign(tirx.Select(a < c32(TANH_SMALL), small, large), x)

        return nan_through(x, let(tirx.abs(x), by_size, "a"))

    return let(x, body, "x")


def erf(x: Expr) -> Expr:
    def body(x: tirx.Var) -> Expr:
        def ratio(xc: tirx.Var) -> Expr:
            z = xc * xc
            r = xc * (horner(z, ERF_ALPHA) / horner(z, ERF_BETA))  # no subnormal x A(x^2) first
            return tirx.Select(tirx.abs(x) < c32(ERF_ONE), r, tirx.copysign(c32(1.0), x))

        return nan_through(x, let(tirx.Min(tirx.Max(x, c32(-ERF_ONE)), c32(ERF_ONE)), ratio, "xc"))

    return let(x, body, "x")


EXPANSIONS: dict[str, Callable[[Expr], Expr]] = {"tirx.exp": exp, "tirx.sigmoid": sigmoid, "tirx.tanh": tanh,
                                                 "tirx.erf": erf}

__all__ = ["EXPANSIONS", "ULP_BOUNDS", "erf", "exp", "sigmoid", "tanh"]
