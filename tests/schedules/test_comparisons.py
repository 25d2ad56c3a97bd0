"""NaNExactComparisons: float ``!=`` and negated float comparisons keep their IEEE 754
result for NaN after TVM's simplifier and LLVM code generation, compared with numpy."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from schedules.cpu.comparisons import NaNExactComparisons, nan_exact_comparisons

from ..conftest import llvm_target

VALUES = np.array([1.0, 2.0, np.nan, -np.inf, 1.5, np.inf], "float32")


@T.prim_func(s_tir=True)
def negations(a: T.Buffer((6,), "float32"), b: T.Buffer((6,), "float32"),
              out: T.Buffer((7, 6), "int8")):
    """Each comparison as a schedule leaves it after inlining ``logical_not(cmp(a, b))``."""
    for i in range(6):
        with T.sblock("compare"):
            vi = T.axis.remap("S", [i])
            out[0, vi] = T.Cast("int8", not (a[vi] == b[vi]))  # noqa: SIM201 - the form under test
            out[1, vi] = T.Cast("int8", not (a[vi] < b[vi]))
            out[2, vi] = T.Cast("int8", not (a[vi] <= b[vi]))
            out[3, vi] = T.Cast("int8", not (a[vi] > b[vi]))
            out[4, vi] = T.Cast("int8", not (a[vi] >= b[vi]))
            out[5, vi] = T.Cast("int8", a[vi] != b[vi])
            out[6, vi] = T.Cast("int8", not (a[vi] != b[vi]))  # noqa: SIM202 - the form under test


def expected(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        rows = [~(a == b), ~(a < b), ~(a <= b), ~(a > b), ~(a >= b), a != b, ~(a != b)]
    return np.stack(rows).astype("int8")


def run(func, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lib = tvm.compile(tvm.IRModule({"main": func}), target=llvm_target())
    out = tvm.runtime.tensor(np.zeros((7, 6), "int8"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    return out.numpy()


@pytest.mark.parametrize("b_value", [1.0, np.nan], ids=["b_number", "b_nan"])
def test_comparisons_keep_the_ieee_result_for_nan(b_value):
    a, b = VALUES, np.full(6, b_value, "float32")
    np.testing.assert_array_equal(run(nan_exact_comparisons(negations), a, b), expected(a, b))


def test_without_the_rewrite_tvm_drops_the_nan_case():
    """Why the pass exists: TVM alone gets NaN wrong for the negations and ``!=``."""
    a, b = VALUES, np.ones(6, "float32")
    got, want = run(negations, a, b), expected(a, b)
    assert (got[:, 2] != want[:, 2]).any()  # the NaN column


def test_integer_comparisons_and_other_targets_are_left_alone():
    @T.prim_func(s_tir=True)
    def ints(a: T.Buffer((4,), "int32"), out: T.Buffer((4,), "int8")):
        for i in range(4):
            with T.sblock("compare"):
                vi = T.axis.remap("S", [i])
                out[vi] = T.Cast("int8", not (a[vi] != 3))  # noqa: SIM202 - the form under test

    tvm.ir.assert_structural_equal(nan_exact_comparisons(ints), ints)
    cuda_target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    cuda = tvm.IRModule({"main": negations.with_attr("target", cuda_target)})
    tvm.ir.assert_structural_equal(NaNExactComparisons()(cuda), cuda)


def test_rewrite_is_idempotent_in_result():
    """Applying the pass twice gives the same results (the guards it adds are exact)."""
    a, b = VALUES, np.full(6, np.nan, "float32")
    twice = nan_exact_comparisons(nan_exact_comparisons(negations))
    np.testing.assert_array_equal(run(twice, a, b), expected(a, b))
