"""The differential oracle: our compiled module against TVM's unoptimized build and numpy."""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

import aicf_tvm

TARGET = {"kind": "llvm", "num-cores": 2}


class ReferenceFailed(Exception):
    """TVM's own default build could not build or run the module: no verdict possible."""


def tolerance(dtypes: set[str]) -> dict[str, float]:
    """float32: rtol 1e-4, atol 1e-5. A float16 value anywhere upstream: a 1-ulp float32
    difference can flip a float16 rounding (2^-11 relative), so 1e-2."""
    if "float16" in dtypes:
        return {"rtol": 1e-2, "atol": 1e-2}
    return {"rtol": 1e-4, "atol": 1e-5}


def _as_list(out: Any) -> list[np.ndarray]:
    if hasattr(out, "numpy"):
        return [out.numpy()]
    return [o.numpy() if hasattr(o, "numpy") else np.asarray(o) for o in out]


def run_reference(mod: tvm.IRModule, inputs: list[np.ndarray]) -> list[np.ndarray]:
    target = tvm.target.Target(TARGET)
    try:
        ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
        vm = relax.VirtualMachine(ex, tvm.cpu())
        return _as_list(vm["main"](*[tvm.runtime.tensor(a) for a in inputs]))
    except Exception as err:
        raise ReferenceFailed(f"{type(err).__name__}: {str(err)[:300]}") from err


def run_ours(mod: tvm.IRModule, inputs: list[np.ndarray]) -> list[np.ndarray]:
    model = aicf_tvm.compile(mod, target=TARGET)
    out = model(*inputs)
    return [np.asarray(o) for o in (out if isinstance(out, list) else [out])]


def assert_close(ours: list[np.ndarray], want: list[np.ndarray], tol: dict[str, float], what: str) -> None:
    assert len(ours) == len(want), f"{what}: {len(ours)} outputs, expected {len(want)}"
    for k, (a, b) in enumerate(zip(ours, want)):
        assert a.shape == b.shape, f"{what}: output {k} shape {a.shape}, expected {b.shape}"
        assert a.dtype == b.dtype, f"{what}: output {k} dtype {a.dtype}, expected {b.dtype}"
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), err_msg=f"{what}: output {k}",
                                   equal_nan=True, **tol)


def check_module(mod: tvm.IRModule, inputs: list[np.ndarray], dtypes: set[str],
                 numpy_out: list[np.ndarray] | None = None) -> None:
    """Ours must match TVM's default build (and numpy, with a numpy-vs-float32 margin)."""
    want = run_reference(mod, inputs)
    ours = run_ours(mod, inputs)
    tol = tolerance(dtypes)
    assert_close(ours, want, tol, "aicf vs TVM default build")
    if numpy_out is not None and all(np.all(np.isfinite(w)) for w in want):
        loose = {"rtol": max(tol["rtol"], 1e-3), "atol": max(tol["atol"], 1e-4)}
        assert_close(ours, [np.asarray(o) for o in numpy_out], loose, "aicf vs numpy")
