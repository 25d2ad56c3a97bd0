"""BoundShapes: symbolic shapes simplified under the function's stated bounds."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import aicf_tvm
from relax_passes.bound_shapes import BoundShapes, bounds_of

TARGET = {"kind": "llvm", "num-cores": 2}


def position_table(bounded: bool) -> tvm.IRModule:
    """``x[n, 8] + table[:n]`` with a 512-row table: slicing infers ``min(n, 512)`` rows."""
    attrs = {"tir_var_lower_bound": {"n": 1}, "tir_var_upper_bound": {"n": 512}} if bounded else {}

    @I.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor(("n", 8), "float32"), table: R.Tensor((512, 8), "float32")):
            n = T.int64()
            R.func_attr(attrs)
            with R.dataflow():
                rows = R.strided_slice(table, axes=[0], begin=[0], end=[n])
                y = R.add(x, rows)
                R.output(y)
            return y

    return Module


def _result_shape(mod: tvm.IRModule):
    return mod["main"].body.body.ty.shape


def test_min_with_the_bound_simplifies_and_the_sum_keeps_its_shape():
    """Without the pass the sum has no shape (``min(n, 512)`` vs ``n`` cannot be proven to
    broadcast); under ``n <= 512`` the slice has ``n`` rows, so the sum is ``[n, 8]``."""
    before = position_table(bounded=True)
    assert _result_shape(before) is None
    after = BoundShapes()(before)
    shape = _result_shape(after)
    assert shape is not None and len(shape.values) == 2
    n = after["main"].params[0].ty.shape.values[0]
    assert tvm_ffi.structural_equal(shape.values[0], n) and int(shape.values[1]) == 8
    assert bounds_of(after["main"]) == {"n": (1, 512)}


def test_without_bounds_nothing_changes():
    mod = position_table(bounded=False)
    assert tvm_ffi.structural_equal(BoundShapes()(mod), mod)


def test_idempotent():
    once = BoundShapes()(position_table(bounded=True))
    assert tvm_ffi.structural_equal(BoundShapes()(once), once)


@pytest.mark.parametrize("rows", [1, 37, 512])
def test_compiled_model_matches_numpy_for_every_bound_length(rows):
    compiled = aicf_tvm.compile(position_table(bounded=True), target=TARGET)
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 8)).astype("float32")
    table = rng.standard_normal((512, 8)).astype("float32")
    np.testing.assert_allclose(compiled(x, table), x + table[:rows], rtol=1e-6, atol=1e-6)


def test_a_length_outside_the_bounds_is_refused_naming_input_and_dim():
    compiled = aicf_tvm.compile(position_table(bounded=True), target=TARGET)
    x = np.zeros((513, 8), "float32")
    with pytest.raises(aicf_tvm.InputError, match=r"input x: dim n = 513 is outside its bounds \[1, 512\]"):
        compiled(x, np.zeros((512, 8), "float32"))


def test_a_dim_named_twice_must_agree_across_inputs():
    @I.ir_module
    class TwoInputs:
        @R.function
        def main(x: R.Tensor(("n", 8), "float32"), y: R.Tensor(("n", 8), "float32")):
            with R.dataflow():
                z = R.add(x, y)
                R.output(z)
            return z

    compiled = aicf_tvm.compile(TwoInputs, target=TARGET)
    with pytest.raises(aicf_tvm.InputError, match=r"input y: dim n = 4, but input x has n = 3"):
        compiled(np.zeros((3, 8), "float32"), np.zeros((4, 8), "float32"))
