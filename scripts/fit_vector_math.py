"""Fit the polynomial coefficients of ``schedules/cpu/vector_math.py``.

Usage: ``python -m scripts.fit_vector_math NAME DEGREE`` (EXP_Q 6, ERF_P 19, LOG_P 4).

Each kernel evaluates one polynomial in float64 on a reduced argument; this script finds
near-minimax coefficients for the weighted (relative) error by Lawson's iteratively
reweighted least squares on a Chebyshev basis, with reference values from mpmath at 40
digits, and prints them with the maximum weighted error on a dense grid.  The printed
tuples are pasted into ``vector_math.py``; the float32 ulp bounds of the kernels are
measured separately (``scripts/sweep_vector_math.py``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import mpmath as mp
import numpy as np

mp.mp.dps = 40
LN2_HALF = 0.5 * float(mp.log(2)) * (1 + 1e-6)  # |r| after exp's range reduction, with slack


def _q_exp(r: mp.mpf) -> mp.mpf:
    """(e^r - 1 - r) / r^2: exp(r) = 1 + r + r^2 Q(r) and expm1(r) = r + r^2 Q(r)."""
    return mp.mpf(1) / 2 if r == 0 else (mp.expm1(r) - r) / r**2


def _w_exp(r: mp.mpf) -> mp.mpf:
    """Weight making an error in Q an error relative to both expm1(r) and exp(r)."""
    return abs(r) if r == 0 else r**2 / abs(mp.expm1(r))


def _p_erf(t: mp.mpf) -> mp.mpf:
    """erf(x) / x as a function of t = x^2."""
    return 2 / mp.sqrt(mp.pi) if t == 0 else mp.erf(mp.sqrt(t)) / mp.sqrt(t)


def _p_log(z: mp.mpf) -> mp.mpf:
    """log(m) = 2s + s z P(z) with s = (m-1)/(m+1), z = s^2 (2 atanh(s) = log(m))."""
    return mp.mpf(2) / 3 if z == 0 else (2 * mp.atanh(mp.sqrt(z)) / mp.sqrt(z) - 2) / z


def fit(f: Callable, w: Callable, lo: float, hi: float, degree: int, points: int = 4000,
        iterations: int = 200) -> tuple[list[float], float]:
    """Monomial coefficients (lowest first) minimizing max |w (p - f)| on [lo, hi]."""
    nodes = np.cos(np.pi * (np.arange(points) + 0.5) / points)
    xs = 0.5 * (hi + lo) + 0.5 * (hi - lo) * nodes
    fx = np.array([float(f(mp.mpf(x))) for x in xs])
    wx = np.array([float(w(mp.mpf(x))) for x in xs])
    basis = np.polynomial.chebyshev.chebvander(nodes, degree)
    lawson = np.full(points, 1.0 / points)
    for _ in range(iterations):
        sw = np.sqrt(lawson) * wx
        cheb = np.linalg.lstsq(basis * sw[:, None], fx * sw, rcond=None)[0]
        err = np.abs(wx * (basis @ cheb - fx))
        lawson = lawson * err
        lawson /= lawson.sum()
    # Chebyshev series in the scaled variable -> monomials in x, in exact arithmetic
    a, b = mp.mpf(lo), mp.mpf(hi)
    u = [(-(a + b) / (b - a)), 2 / (b - a)]  # u = u0 + u1 x maps [lo, hi] to [-1, 1]
    t_prev, t_cur = [mp.mpf(1)], [u[0], u[1]]
    mono = [mp.mpf(0)] * (degree + 1)
    for k, c in enumerate(cheb):
        tk = t_prev if k == 0 else t_cur
        if k >= 2:
            nxt = [mp.mpf(0)] * (k + 1)
            for i, v in enumerate(t_cur):
                nxt[i] += 2 * u[0] * v
                nxt[i + 1] += 2 * u[1] * v
            for i, v in enumerate(t_prev):
                nxt[i] -= v
            t_prev, t_cur = t_cur, nxt
            tk = t_cur
        for i, v in enumerate(tk):
            mono[i] += mp.mpf(c) * v
    coeffs = [float(c) for c in mono]
    grid = np.linspace(lo, hi, 20001)
    worst = 0.0
    for x in grid[::10]:
        p = 0.0
        for c in reversed(coeffs):
            p = p * x + c
        worst = max(worst, float(abs(w(mp.mpf(x)) * (p - f(mp.mpf(x))))))
    return coeffs, worst


FITS = {
    "EXP_Q": (_q_exp, _w_exp, -LN2_HALF, LN2_HALF),
    "ERF_P": (_p_erf, lambda t: 1 / _p_erf(t), 0.0, 16.0),
    "LOG_P": (_p_log, lambda z: z / 2, 0.0, 0.0295),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(FITS))
    parser.add_argument("degree", type=int)
    args = parser.parse_args()
    f, w, lo, hi = FITS[args.name]
    coeffs, worst = fit(f, w, lo, hi, args.degree)
    print(f"# degree {args.degree} on [{lo}, {hi}]: max weighted error {worst:.3e}")
    print(f"{args.name} = (" + ", ".join(repr(c) for c in coeffs) + ")")


if __name__ == "__main__":
    main()
