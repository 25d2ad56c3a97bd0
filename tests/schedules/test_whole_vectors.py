"""A float max over a symbolic extent padded to whole vectors (``schedules.cpu.whole_vectors``).

The padded max repeats the last element, so it must equal numpy's max at every length,
a NaN in the last place, an all ``-inf`` row and signed zeros included; a sum, an int max
and a max over a constant extent are left as they are.
"""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.script import tirx as T

from schedules.cpu.whole_vectors import pad_symbolic_max

from ..conftest import llvm_target


def _row_reduce(combine: str, dtype: str = "float32"):
    """``B[i] = reduce(A[i, k] for k < n)``: ``combine`` "max" or "sum"."""

    @T.prim_func(s_tir=True)
    def func(a: T.handle, b: T.handle):
        n = T.int64()
        A = T.match_buffer(a, (T.int64(6), n), dtype)
        B = T.match_buffer(b, (T.int64(6),), dtype)
        for i, k in T.grid(T.int64(6), n):
            with T.sblock("reduce"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    B[vi] = T.min_value(dtype) if combine == "max" else T.cast(0, dtype)
                if combine == "max":
                    B[vi] = T.max(B[vi], A[vi, vk] * T.cast(2, dtype))
                else:
                    B[vi] = B[vi] + A[vi, vk]

    return func


@T.prim_func(s_tir=True)
def constant_max(A: T.Buffer((6, 40), "float32"), B: T.Buffer((6,), "float32")):
    for i, k in T.grid(6, 40):
        with T.sblock("reduce"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                B[vi] = T.min_value("float32")
            B[vi] = T.max(B[vi], A[vi, vk])


def _reduce_extents(func: tirx.PrimFunc) -> list:
    found = []
    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, lambda b: found.append(b.iter_vars[-1].dom.extent)
                                         if b.name_hint == "reduce" else None)])
    return found


def _build(func: tirx.PrimFunc):
    sch = s_tir.Schedule(func)
    with llvm_target() as target:
        return tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target=target)


def test_the_padded_extent_is_a_multiple_of_the_lanes():
    [extent] = _reduce_extents(pad_symbolic_max(_row_reduce("max"), 16))
    assert tvm.sym.Analyzer().can_prove(tirx.floormod(extent, 16) == 0)
    n = tirx.analysis.undefined_vars(extent)[0]
    for length in (1, 15, 16, 17):
        analyzer = tvm.sym.Analyzer()
        analyzer.bind(n, tirx.const(length, "int64"))
        assert analyzer.simplify(extent).value == -(-length // 16) * 16


@pytest.mark.parametrize("length", [1, 5, 16, 17, 40])
def test_padded_max_equals_numpy(length):
    rng = np.random.default_rng(length)
    a = rng.standard_normal((6, length)).astype("float32")
    a[1, -1] = np.nan  # NaN in the place the padding repeats
    a[2, :] = -np.inf
    a[3, :] = -0.0
    a[4, 0] = np.inf
    lib = _build(pad_symbolic_max(_row_reduce("max"), 16))
    out = tvm.runtime.tensor(np.zeros(6, "float32"))
    lib["main"](tvm.runtime.tensor(a), out)
    want = (a * 2).max(axis=1)
    np.testing.assert_array_equal(np.isnan(out.numpy()), np.isnan(want))
    np.testing.assert_array_equal(np.nan_to_num(out.numpy()), np.nan_to_num(want))


@pytest.mark.parametrize("func", [_row_reduce("sum"), _row_reduce("max", "int32"), constant_max],
                         ids=["float sum", "int max", "constant extent"])
def test_other_reductions_are_left_alone(func):
    tvm.ir.assert_structural_equal(pad_symbolic_max(func, 16), func)
