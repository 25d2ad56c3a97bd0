"""Helpers for pass tests: strip Emit annotations for structural comparison."""

from __future__ import annotations

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
