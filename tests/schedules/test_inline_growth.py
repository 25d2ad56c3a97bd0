"""Inlining that would copy copies of a block is refused past a size (``schedules/inline_growth.py``)."""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx

from schedules.cpu import Elementwise
from schedules.inline_growth import MAX_INLINED_NODES, inlines_too_much

from .test_cpu_elementwise import check_rule, prim_funcs, relax_module


def _doubling(steps: int):
    """``x + x``, then that plus itself, ``steps`` times: each add reads the one before twice."""
    def body(x):
        for _ in range(steps):
            x = relax.op.add(x, x)
        return x

    return relax_module([(4, 64)], body)


def _largest_store(script_func: tirx.PrimFunc) -> int:
    sizes = []

    def store(s: tirx.BufferStore) -> None:
        count = [0]
        tvm_ffi.structural_walk(s.value, [(tvm.ir.Expr, lambda _: count.__setitem__(0, count[0] + 1))])
        sizes.append(count[0])

    tvm_ffi.structural_walk(script_func.body, [(tirx.BufferStore, store)])
    return max(sizes)


def test_a_short_chain_is_inlined_whole():
    (func,) = prim_funcs(_doubling(4)).values()
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(sch.get_block("root") if hasattr(sch, "get_block") else sch.get_sblock("root"))
    assert not any(inlines_too_much(sch, b, reverse=False) for b in blocks)


def test_a_doubling_chain_stays_below_the_bound_and_computes_the_same():
    """10 doublings inlined whole make an expression of 2^11 nodes (24: minutes of LLVM);
    the rule leaves blocks materialized so that no store exceeds the bound, and the result
    is x * 2^10, exact in float32."""
    steps = 10
    mod = _doubling(steps)
    x = np.random.default_rng(31).standard_normal((4, 64)).astype(np.float32)
    check_rule(Elementwise(), mod, [x], x.astype(np.float64) * 2.0 ** steps)
    (func,) = prim_funcs(mod).values()
    assert _largest_store(func) <= MAX_INLINED_NODES
