"""Maximum float32 ulp error of ``VectorizeMath``'s functions and of what they replace.

Usage: ``python -m scripts.sweep_vector_math [--functions exp erf ...] [--stride 1]``

Every float32 bit pattern (``--stride 1``: all 2^32, about 4 minutes per function on an
idle core pair; ``--stride 41``: 1.05e8 points) goes through each implementation, each a
compiled TVM kernel over 2^22-element chunks:

* ``vector``: the ``VectorizeMath`` expansion, in a vectorized loop;
* ``tvm``: TVM's own lowering of the same call, where it is not the libm function itself:
  for tanh and sigmoid, TVM's float32 formulas built on ``expf`` (for exp, erf and log it
  is the ``glibc`` row: TVM calls ``expf``/``erff``/``logf``);
* ``glibc``: the libm float32 function itself (``tanhf`` etc.), called per element.

The reference is the float64 function (numpy; ``scipy.special`` for erf and sigmoid),
whose own error (~1e-16 relative) is ~2e-9 float32 ulp.  The error of a result ``y`` is
``|y - ref| / ulp(ref)`` with ulp(ref) the float32 spacing at ``ref`` (2^-149 below the
normal range); an infinite ``y`` counts as ±2^128, and where ``ref`` rounds to ±inf a
result of that infinity is exact.  NaN must map to NaN, a zero result must carry the
reference's sign.  Printed per implementation: the maximum error and an input where it
occurs, the share of results that are not the correctly rounded float32 value, and the
count of NaN or signed-zero mismatches.  A correctly rounded result counts as 0.5 ulp (its
bound), so "0.5000" means every result was the correctly rounded one.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.special
import tvm
from tvm import te, tirx

from aicf_tvm.runtime.targets import resolve_target
from aicf_tvm.runtime.threads import thread_count, use_threads
from schedules.cpu.common import try_parallel
from schedules.cpu.relaxed_math import EXPANSIONS as RELAXED
from schedules.cpu.vector_math import vectorize_math

CHUNK = 1 << 22
REFERENCE = {
    "exp": np.exp, "erf": scipy.special.erf, "tanh": np.tanh, "sigmoid": scipy.special.expit,
    "log": np.log,
}
GLIBC = {"exp": "expf", "erf": "erff", "tanh": "tanhf", "log": "logf"}
TVM_FORMULA = ("tanh", "sigmoid")  # TVM expands these itself; the others it lowers to GLIBC
SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1.17549435e-38,
                     3.4028235e38, -3.4028235e38], dtype=np.float32)


def kernel(name: str, impl: str, target: tvm.target.Target):
    """A compiled y = f(x) over CHUNK floats for one implementation."""
    a = te.placeholder((CHUNK,), "float32", name="a")
    if impl == "glibc":
        body = lambda i: tirx.call_pure_extern("float32", GLIBC[name], a[i])
    else:
        body = lambda i: getattr(tirx, name)(a[i])
    out = te.compute((CHUNK,), body, name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, out]))
    (loop,) = sch.get_loops(sch.get_sblock("y"))
    outer, inner = sch.split(loop, [None, 16])
    try_parallel(sch, outer)
    func = sch.mod["main"]
    if impl in ("vector", "relaxed"):
        sch.vectorize(inner)
        func = vectorize_math(sch.mod["main"], relaxed=impl == "relaxed")
    return tvm.compile(tvm.IRModule({"main": func}), target=target).mod["main"]


def ulp_errors(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|y - ref| in float32 ulps of ref (see the module docstring); inf for a NaN mismatch."""
    with np.errstate(over="ignore", invalid="ignore"):
        ref32 = ref.astype(np.float32)
    with np.errstate(invalid="ignore"):
        yd = y.astype(np.float64)
    _, exponent = np.frexp(ref)
    exponent = np.where(ref == 0, -1000, exponent)
    ulp = np.ldexp(1.0, np.maximum(exponent - 24, -149))
    overflow = np.isinf(ref32) & np.isfinite(ref)
    ulp = np.where(overflow, 2.0**104, ulp)
    yd = np.where(np.isinf(yd) & ~overflow & ~np.isinf(ref), np.copysign(2.0**128, yd), yd)
    with np.errstate(invalid="ignore"):
        err = np.abs(yd - ref) / ulp
    err = np.where(overflow & (y == ref32), 0.0, err)
    err = np.where(np.isinf(ref) & (yd == ref), 0.0, err)
    nan_ref, nan_y = np.isnan(ref), np.isnan(y)
    err = np.where(nan_ref & nan_y, 0.0, err)
    return np.where(nan_ref != nan_y, np.inf, err)


@dataclass
class Tally:
    """Running worst case of one implementation.

    A correctly rounded result is at most 0.5 ulp off, so errors are computed only where
    ``y`` differs from the correctly rounded reference (rare), which keeps a full sweep cheap.
    """

    worst: float = 0.0
    worst_x: float = 0.0
    misrounded: int = 0
    mismatches: list = field(default_factory=list)
    count: int = 0

    def add(self, x: np.ndarray, y: np.ndarray, ref: np.ndarray) -> None:
        with np.errstate(over="ignore", invalid="ignore"):
            ref32 = ref.astype(np.float32)
        same_sign = np.signbit(y) == np.signbit(ref32)
        rounded = ((y == ref32) & same_sign) | (np.isnan(y) & np.isnan(ref32))
        self.count += len(x)
        if rounded.any():
            self.worst = max(self.worst, 0.5)
        off = ~rounded
        if not off.any():
            return
        x, y, ref = x[off], y[off], ref[off]
        self.misrounded += len(x)
        err = ulp_errors(y, ref)
        i = int(np.argmax(err))
        if err[i] > self.worst:
            self.worst, self.worst_x = float(err[i]), float(x[i])
        bad = np.isinf(err) | ((ref == 0) & (y == 0))  # NaN mismatch, or a zero of the wrong sign
        if bad.any() and len(self.mismatches) < 5:
            self.mismatches.extend((float(a), float(b)) for a, b in zip(x[bad][:5], y[bad][:5]))


def sweep(name: str, impls: list[str], stride: int, target: tvm.target.Target) -> dict[str, Tally]:
    kernels = {impl: kernel(name, impl, target) for impl in impls}
    tallies = {impl: Tally() for impl in impls}
    x_dev = tvm.runtime.tensor(np.zeros(CHUNK, np.float32))
    y_dev = tvm.runtime.tensor(np.zeros(CHUNK, np.float32))
    span = (CHUNK - len(SPECIALS)) * stride
    for start in range(0, 1 << 32, span):
        stop = min(start + span, 1 << 32)
        bits = np.arange(start, stop, stride, dtype=np.uint64).astype(np.uint32)
        x = np.concatenate([bits.view(np.float32), SPECIALS])
        with np.errstate(all="ignore"):
            ref = REFERENCE[name](x.astype(np.float64))
        x_dev.copyfrom(np.resize(x, CHUNK))
        for impl, run in kernels.items():
            run(x_dev, y_dev)
            tallies[impl].add(x, y_dev.numpy()[: len(x)], ref)
        if (start // span) % 64 == 63:
            print(f"  {name}: {min(start + span, 1 << 32) / 2**32:.0%} of the bit patterns",
                  file=sys.stderr, flush=True)
    return tallies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", nargs="+", default=list(REFERENCE), choices=list(REFERENCE))
    parser.add_argument("--impls", nargs="+", default=["vector", "tvm", "glibc"])
    parser.add_argument("--stride", type=int, default=1, help="take every STRIDE-th bit pattern")
    parser.add_argument("--target", default="llvm")
    args = parser.parse_args()
    target = resolve_target(args.target)
    use_threads(thread_count(None, target.export()))  # what a compiled model runs with
    print(f"{'function':8s} {'impl':7s} {'points':>11s} {'max ulp':>9s} {'at x':>16s} "
          f"{'not CR':>9s} {'NaN/sign bad':>12s}")
    for name in args.functions:
        impls = [i for i in args.impls
                 if (i != "glibc" or name in GLIBC) and (i != "tvm" or name in TVM_FORMULA)
                 and (i != "relaxed" or f"tirx.{name}" in RELAXED)]
        started = time.time()
        for impl, t in sweep(name, impls, args.stride, target).items():
            print(f"{name:8s} {impl:7s} {t.count:11d} {t.worst:9.6f} {t.worst_x:16.9g} "
                  f"{t.misrounded / t.count:9.2e} {len(t.mismatches):12d}"
                  + (f"  e.g. {t.mismatches[:3]}" if t.mismatches else ""), flush=True)
        print(f"  ({time.time() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
