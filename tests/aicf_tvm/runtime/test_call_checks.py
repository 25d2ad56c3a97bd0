"""``aicf_tvm/call_checks.py``: the call-time checks that need only numpy and TVM's runtime
(shape requirements as JSON dim expressions, index checks on the host)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm

from aicf_tvm import InputError
from aicf_tvm.runtime.call_checks import (
    Requirement,
    check_indices_on_host,
    check_requirements,
    check_values,
    evaluate,
    names_in,
    render,
)

MATMUL = Requirement(["==", "b", 16], "matmul of input x and a constant float32 [16, 8] tensor",
                     "its contraction dims")


def test_expressions_evaluate_with_python_ints_and_floor_division():
    dims = {"a": -7, "b": 2}
    assert evaluate(["//", "a", "b"], dims) == -4 and evaluate(["%", "a", "b"], dims) == 1
    assert evaluate(["*", "a", 10**12], dims) == -7 * 10**12  # no int64 overflow surprises
    assert evaluate(["select", ["<", "a", 0], ["-", 0, "a"], "a"], dims) == 7
    assert evaluate(["//", "a", 0], dims) is None
    assert names_in(["and", ["<=", "a", "b"], ["==", "c", "a"]]) == ["a", "b", "c"]


def test_requirement_round_trips_through_json():
    assert Requirement.from_json(json.loads(json.dumps(MATMUL.to_json()))) == MATMUL
    assert str(MATMUL) == "b == 16" and render(["min", "a", ["+", "b", 1]]) == "min(a, b + 1)"


def test_a_broken_requirement_names_input_dim_axis_and_op():
    dims = {"a": (3, "x", 0), "b": (40, "x", 1)}
    with pytest.raises(InputError, match=r"^input x: dim b = 40 \(axis 1\), but matmul of input x "
                                         r"and a constant float32 \[16, 8\] tensor requires "
                                         r"b == 16 \(its contraction dims\)"):
        check_requirements([MATMUL], dims)
    check_requirements([MATMUL], {**dims, "b": (16, "x", 1)})
    check_requirements([MATMUL], {"a": (3, "x", 0)})  # b bound by no input: not checked here


def test_values_are_checked_per_coordinate_and_counted_from_the_end():
    fixed, bad = check_values(np.array([[3, -2], [-4, 1]]), [4, 2], True)
    assert bad is None and fixed.tolist() == [[3, 0], [0, 1]]
    assert check_values(np.array([[3, 1], [0, 2]]), [4, 2], True)[1] == (2, (1, 1), -2, 2)
    assert check_values(np.array([0, -1]), [5], False)[1] == (-1, (1,), 0, 5)
    big = np.array([1, 2**64 - 1], dtype=np.uint64)
    assert check_values(big, [5], True)[1] == (2**64 - 1, (1,), 0, 5)


def test_the_host_check_returns_the_counted_indices_or_raises():
    def check(indices: list, out_dtype: str) -> tvm.runtime.Tensor:
        return check_indices_on_host(tvm.runtime.tensor(np.array(indices)), "input i", "a take", 1,
                                     out_dtype, 5)

    got = check([-1, 2], "int32")
    assert got.numpy().tolist() == [4, 2] and got.dtype == "int32"
    with pytest.raises(InputError, match=r"input i: index 7 at \[1\] is out of range \[-5, 5\)"):
        check([0, 7], "int64")
