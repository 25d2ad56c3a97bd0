"""A float max over keys that are not whole vectors, padded to whole vectors (``schedules.cpu.whole_vectors``).

The padded max repeats real elements (the last one for a symbolic extent, the ones before
an overlapping last vector for a constant one), so it must equal numpy's max at every
length, a NaN in the last place, an all ``-inf`` row and signed zeros included; a sum, an
integer max and a max over a whole number of vectors are left as they are.
"""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.script import tirx as T

from schedules.cpu.whole_vectors import pad_max

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


def _constant_max(length: int, dtype: str = "float32"):
    """``B[i] = max(A[i, k] * 2 for k < length)`` over a constant extent."""

    @T.prim_func(s_tir=True)
    def func(A: T.Buffer((6, length), dtype), B: T.Buffer((6,), dtype)):
        for i, k in T.grid(6, length):
            with T.sblock("reduce"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    B[vi] = T.min_value(dtype)
                B[vi] = T.max(B[vi], A[vi, vk] * T.cast(2, dtype))

    return func


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
    [extent] = _reduce_extents(pad_max(_row_reduce("max"), 16))
    assert tvm.sym.Analyzer().can_prove(tirx.floormod(extent, 16) == 0)
    n = tirx.analysis.undefined_vars(extent)[0]
    for length in (1, 15, 16, 17):
        analyzer = tvm.sym.Analyzer()
        analyzer.bind(n, tirx.const(length, "int64"))
        assert analyzer.simplify(extent).value == -(-length // 16) * 16


def _special_rows(length: int, repeated: int) -> np.ndarray:
    rng = np.random.default_rng(length)
    a = rng.standard_normal((6, length)).astype("float32")
    a[1, -1] = np.nan  # last: TVM's max keeps a NaN only when no term follows it, padded or not
    a[2, :] = -np.inf
    a[3, :] = -0.0
    a[3, repeated] = 0.0  # +0 in a repeated place among -0
    a[4, 0] = np.inf
    return a


def _check_max(lib, a: np.ndarray) -> None:
    out = tvm.runtime.tensor(np.zeros(6, a.dtype))
    lib["main"](tvm.runtime.tensor(a), out)
    want = (a * 2).max(axis=1)
    np.testing.assert_array_equal(np.isnan(out.numpy()), np.isnan(want))
    # equal as values: which zero a max of -0 and +0 returns follows the order of the
    # terms, which the padding (and the attention rule's split over lanes) changes; the
    # softmax subtracts the max, and x - (+0) and x - (-0) differ only for x = -0, where
    # exp gives 1 either way
    np.testing.assert_array_equal(np.nan_to_num(out.numpy()), np.nan_to_num(want))


@pytest.mark.parametrize("length", [1, 5, 16, 17, 40])
def test_padded_symbolic_max_equals_numpy(length):
    _check_max(_build(pad_max(_row_reduce("max"), 16)), _special_rows(length, -1))


@pytest.mark.parametrize("length", [17, 40, 197])
def test_padded_constant_max_reads_whole_vectors_and_equals_numpy(length):
    padded = pad_max(_constant_max(length), 16)
    [extent] = _reduce_extents(padded)
    assert int(extent) == -(-length // 16) * 16
    # the repeated terms are the ones just before the overlapping last vector
    _check_max(_build(padded), _special_rows(length, length - 16 - 1))
    _check_max(_build(padded), _special_rows(length, length // 16 * 16 - 1))


@pytest.mark.parametrize("func", [_row_reduce("sum"), _row_reduce("max", "int8"), _constant_max(40, "int8"),
                                  _constant_max(48), _constant_max(9)],
                         ids=["float sum", "int max", "constant int max", "whole vectors", "under one vector"])
def test_other_reductions_are_left_alone(func):
    tvm.ir.assert_structural_equal(pad_max(func, 16), func)
