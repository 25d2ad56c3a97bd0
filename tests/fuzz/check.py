"""The differential oracle: our compiled module against TVM's unoptimized build and numpy.

An element of ours passes when it is close to TVM's default build (NaN equals NaN, an
infinity only itself, and an exact zero only a zero of the same sign), or when it is
exactly the IEEE value numpy computes and that value is special (±0, ±inf, NaN): TVM's
own build is not IEEE-faithful there (its TIR simplifier folds ``x * 0.0`` to ``0``
and ``x + 0.0`` to ``x``; max/min by ``select`` drop NaN), and a compiler that keeps
the IEEE value is right. Where both the reference and numpy are finite, ours must also
be close to numpy in magnitude (with a margin for float32 vs float64; float32 programs
only), so that a lowering bug we share with TVM does not pass unseen; where ours has the
reference's bits, within a wider margin (``SHARED_WIDENING``: an ill-conditioned program
amplifies float32's own rounding). An output summed in another order than the
reference's passes when it is as accurate as the reference against numpy, norm-wise
(``as_accurate``): element by element, two float16 sums of hundreds of products in
different orders differ by more than any useful tolerance, and so do float32 sums that
cancel before an activation squashes the output's scale.

Tolerances are per dtype and norm-wise: an element may be off by ``atol + rtol |ref|``
plus ``scale`` times the largest reference magnitude of that output, because a sum of K
products rounds relative to the terms, not to the (possibly cancelled) result.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import tvm
from tvm import relax

from aicf_tvm.runtime.targets import host_cpu_target

from .numpy_eval import eval_numpy
from .program import Program, random_inputs
from .relax_build import build_module

# Both builds on the host CPU, with its mcpu: that is what ``aicf_tvm.compile`` fills in
# for a target without one, and without it LLVM lowers float16 through soft-float code
# (a 16x300 float16 multiply then takes a minute to load).
TARGET = host_cpu_target(2)

# rtol, atol, scale against TVM's build. float16: a 1-ulp float32 difference upstream can
# flip a float16 rounding (2^-11 relative), and TVM accumulates float16 sums in float16.
TOLERANCES = {"float16": (1e-2, 1e-2, 1e-2), "float32": (1e-4, 1e-5, 1e-5)}
# ... and against numpy's float64 (float32 programs only: TVM rounds every float16
# intermediate to float16, so a K=300 sum is off by ~0.1 and a softmax turns a 1e-3 logit
# error into 10%; numpy's exact values are no oracle for float16 chains).
NUMPY_TOLERANCE = {"rtol": 1e-3, "atol": 1e-4, "scale": 1e-5}
# Where ours has the bits of TVM's build and both are off numpy by more than that margin,
# the program is ill-conditioned there (a softmax over scores in the hundreds turns float32's
# rounding of q·k into 0.2% of an output): such an element passes within this many times the
# margin. A lowering bug shared with TVM is still caught as a gross error.
SHARED_WIDENING = 10.0
# An output ours sums in another order than TVM's build (a blocked convolution over 425
# float16 products; 2352 float32 products whose sum cancels to 0.03 before a tanh, which
# hides the terms' size from the tolerance's scale) differs from it by more than the
# tolerance at some elements, either one closer to the exact value there. Such an output
# passes when it is, over the whole output, about as close to numpy's (float64, rounded
# once per op) as TVM's build is: its error's norm within this factor of TVM's and its
# largest error within twice TVM's.
NORM_SLACK = 1.25


class ReferenceFailed(Exception):
    """TVM's own default build could not build or run the module: no verdict possible."""


class FuzzFailure(AssertionError):
    """Ours is wrong. ``kind``: crash (the process died), timeout, error (an exception),
    count/shape/dtype (of the outputs), values, signed-zero, numpy (ours and TVM's build
    agree with each other but not with numpy)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"[{kind}] {message}")
        self.kind, self.message = kind, message


def tolerance(dtypes: set[str]) -> dict[str, float]:
    """The loosest tolerance of any dtype a value of the program has."""
    rtol, atol, scale = TOLERANCES["float16" if "float16" in dtypes else "float32"]
    return {"rtol": rtol, "atol": atol, "scale": scale}


def flatten(out: Any) -> list[np.ndarray]:
    """A VM result or a list of them (tuples nest) as a flat list of arrays, depth first."""
    if hasattr(out, "numpy"):
        return [out.numpy()]
    if isinstance(out, np.ndarray):
        return [out]
    return [a for o in out for a in flatten(o)]


class Runner(Protocol):
    def both(self, mod: tvm.IRModule, inputs: list[np.ndarray]) -> tuple[list, list]:
        """(reference outputs, our outputs); ``ReferenceFailed`` when the reference fails
        (whatever ours did), else ``FuzzFailure`` when ours does."""


def run_reference(mod: tvm.IRModule, inputs: list[np.ndarray]) -> list[np.ndarray]:
    try:
        ex = tvm.compile(mod, target=TARGET, relax_pipeline=relax.get_default_pipeline(TARGET))
        vm = relax.VirtualMachine(ex, tvm.cpu())
        return flatten(vm["main"](*[tvm.runtime.tensor(a) for a in inputs]))
    except Exception as err:
        raise ReferenceFailed(f"{type(err).__name__}: {str(err)[:300]}") from err


def aligned(arr: np.ndarray, align: int = 64) -> np.ndarray:
    """A C-contiguous copy at an ``align``-byte address. ``CompiledModel`` passes such an
    input zero-copy and copies any other, so without this the path an input takes would
    depend on where numpy happened to allocate it."""
    buf = np.empty(arr.nbytes + align, np.uint8)
    start = -buf.ctypes.data % align
    out = buf[start:start + arr.nbytes].view(arr.dtype).reshape(arr.shape)
    out[...] = arr
    return out


def run_ours(mod: tvm.IRModule, inputs: list[np.ndarray]) -> list[np.ndarray]:
    import aicf_tvm

    model = aicf_tvm.compile(mod, target=TARGET)
    return flatten(model(*[aligned(a) for a in inputs]))


class InProcess:
    """Both builds in this process (an abort inside TVM ends it: see ``worker.Worker``)."""

    def both(self, mod: tvm.IRModule, inputs: list[np.ndarray]) -> tuple[list, list]:
        want = run_reference(mod, inputs)
        try:
            return want, run_ours(mod, inputs)
        except Exception as err:
            raise FuzzFailure("error", f"{type(err).__name__}: {str(err).strip()[:2000]}") from err


def close(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    """Elementwise: NaN equals NaN, an infinity only itself, an exact zero only a zero of
    the same sign; finite values within ``atol + rtol |b|``."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(a) & np.isfinite(b) & (np.abs(a - b) <= atol + rtol * np.abs(b))
    zeros = (a == 0) & (b == 0)
    finite &= ~zeros | (np.signbit(a) == np.signbit(b))
    return finite | (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))


def ieee_special(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Elementwise: ``w`` is ±0, ±inf or NaN and ``a`` is exactly it."""
    a, w = a.astype(np.float64), w.astype(np.float64)
    special = ~np.isfinite(w) | (w == 0)
    return special & close(a, w, 0.0, 0.0)


def _atol(tol: dict[str, float], ref: np.ndarray) -> float:
    finite = np.abs(ref[np.isfinite(ref)].astype(np.float64))
    return tol["atol"] + tol["scale"] * (float(finite.max()) if finite.size else 0.0)


def _describe(bad: np.ndarray, a: np.ndarray, b: np.ndarray, w: np.ndarray | None) -> str:
    where = np.unravel_index(int(np.argmax(bad)), bad.shape) if bad.ndim else ()
    got, want = a[where], b[where]
    extra = f", numpy {w[where]!r}" if w is not None else ""
    af, bf = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore"):
        err = np.abs(af - bf)[bad & np.isfinite(af) & np.isfinite(bf)]
    worst = f"; max |diff| {err.max():.3g}" if err.size else ""
    return f"{int(bad.sum())}/{bad.size} elements differ, first at {tuple(int(i) for i in where)}: " \
           f"ours {got!r}, expected {want!r}{extra}{worst}"


def compare(ours: list[np.ndarray], ref: list[np.ndarray], numpy_out: list[np.ndarray] | None,
            tol: dict[str, float], loose: dict[str, float] | None = NUMPY_TOLERANCE) -> None:
    """Raise ``FuzzFailure`` unless every output of ours passes (see the module docstring);
    ``loose`` is the tolerance against numpy, None for no such check (numpy's special
    values still count where the reference is not IEEE)."""
    if len(ours) != len(ref):
        raise FuzzFailure("count", f"{len(ours)} outputs, expected {len(ref)}")
    for k, (a, b) in enumerate(zip(ours, ref)):
        if a.shape != b.shape:
            raise FuzzFailure("shape", f"output {k}: shape {a.shape}, expected {b.shape}")
        if a.dtype != b.dtype:
            raise FuzzFailure("dtype", f"output {k}: dtype {a.dtype}, expected {b.dtype}")
        w = numpy_out[k] if numpy_out is not None and numpy_out[k].shape == a.shape else None
        ok = close(a, b, tol["rtol"], _atol(tol, b))
        if w is not None:
            ok |= ieee_special(a, w)
        if not ok.all() and w is not None and a.dtype.kind == "f" and as_accurate(a, b, w, ok):
            ok[...] = True
        if not ok.all():
            bad = ~ok
            af, bf = a.astype(np.float64), b.astype(np.float64)
            signs = bad & (af == 0) & (bf == 0)
            kind = "signed-zero" if (signs == bad).all() else "values"
            raise FuzzFailure(kind, f"aicf vs TVM default build: output {k}: {_describe(bad, a, b, w)}")
        if w is not None and loose is not None:  # magnitudes only: a zero's sign is judged against the reference above
            checked = np.isfinite(w.astype(np.float64)) & np.isfinite(b.astype(np.float64))
            bad = checked & ~close(np.abs(a), np.abs(w), loose["rtol"], _atol(loose, w))
            if bad.any():  # ill-conditioned where ours has the reference's bits: a wider margin
                wide = {key: SHARED_WIDENING * value for key, value in loose.items()}
                shared = (a == b) & close(np.abs(a), np.abs(w), wide["rtol"], _atol(wide, w))
                bad &= ~shared
            if bad.any():
                raise FuzzFailure("numpy", f"aicf vs numpy: output {k}: {_describe(bad, a, w, None)}")


def as_accurate(a: np.ndarray, b: np.ndarray, w: np.ndarray, ok: np.ndarray) -> bool:
    """Whether a float output ``a`` that differs from the reference ``b`` where ``ok`` is
    False is about as accurate as ``b`` against numpy's ``w`` (``NORM_SLACK``):
    every differing element finite in all three, and over the finite elements the error's
    norm within the slack of the reference's and the largest error within twice its own."""
    af, bf, wf = (x.astype(np.float64) for x in (a, b, w))
    finite = np.isfinite(af) & np.isfinite(bf) & np.isfinite(wf)
    if not finite[~ok].all():
        return False
    ea, eb, ww = np.abs(af - wf)[finite], np.abs(bf - wf)[finite], wf[finite]
    ulp = float(np.finfo(a.dtype).eps) / 2  # the dtype's relative rounding
    norm = np.linalg.norm
    return (float(norm(ea)) <= NORM_SLACK * float(norm(eb)) + ulp * float(norm(ww))
            and float(ea.max()) <= 2 * float(eb.max()) + ulp * float(np.abs(ww).max()))


def check_module(mod: tvm.IRModule, inputs: list[np.ndarray], dtypes: set[str],
                 numpy_out: list[np.ndarray] | None = None, runner: Runner | None = None) -> None:
    """Ours must match TVM's default build (and numpy, with a numpy-vs-float32 margin).
    Raises ``ReferenceFailed`` when TVM's own build fails, ``FuzzFailure`` when ours does."""
    want, ours = (runner or InProcess()).both(mod, inputs)
    loose = None if "float16" in dtypes else NUMPY_TOLERANCE
    compare(ours, as_declared(want, mod), numpy_out, tolerance(dtypes), loose)


def declared_dtypes(ty: Any) -> list[str]:
    """The dtypes of a (nested tuple) return type, depth first."""
    if isinstance(ty, relax.TensorType):
        return [str(ty.dtype)]
    return [d for f in ty.fields for d in declared_dtypes(f)]


def as_declared(want: list[np.ndarray], mod: tvm.IRModule) -> list[np.ndarray]:
    """The reference outputs in the dtypes ``main`` declares. TVM's build can return wider
    ones (batch_norm in training mode on float16 data returns float32): its values are
    still the reference, rounded to the declared type."""
    dtypes = declared_dtypes(mod["main"].ret_ty)
    if len(dtypes) != len(want):
        return want
    return [w.astype(d) if str(w.dtype) != d and w.dtype.kind == "f" and "float" in d else w
            for w, d in zip(want, dtypes)]


def check_program(prog: Program, runner: Runner) -> None:
    """One drawn program checked end to end (the test's property and ``scripts.fuzz``'s):
    raises ``FuzzFailure`` when ours is wrong, ``ReferenceFailed`` when TVM's build fails."""
    inputs = random_inputs(prog)
    check_module(build_module(prog), inputs, prog.dtypes(), eval_numpy(prog, inputs), runner)
