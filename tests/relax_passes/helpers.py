"""Helpers for pass tests: strip Emit annotations for structural comparison; IEEE-exact
comparison of results on inputs with signed zeros, infinities and NaN."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from aicf_tvm import EMIT_ATTR


def strip_emits(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every ``aicf.emit`` attr removed (checked separately by decoding)."""
    out = tvm.IRModule({}, attrs=mod.attrs) if mod.attrs is not None else tvm.IRModule({})
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function) and func.attrs is not None and EMIT_ATTR in func.attrs:
            func = func.without_attr(EMIT_ATTR)
        out[gv] = func
    return out


def assert_same_values(got: np.ndarray, want: np.ndarray) -> None:
    """Equal values, NaN where NaN, and the same sign on every zero and infinity."""
    np.testing.assert_array_equal(got, want)
    number = ~np.isnan(want)
    np.testing.assert_array_equal(np.signbit(got[number]), np.signbit(want[number]))


def special_floats(rng: np.random.Generator, n: int) -> np.ndarray:
    """±0, ±inf and NaN, then distinct random values: ``n`` float32 values."""
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], "float32")
    return np.concatenate([special, rng.standard_normal(n - special.size).astype("float32")])


def op_names(mod: tvm.IRModule) -> list[str]:
    """The ops ``main``'s bindings call, in binding order, over all its blocks."""
    return [b.value.op.name for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]
