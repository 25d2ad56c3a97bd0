"""Shape promises checked at the call (``CompiledModel.check_inputs`` with the requirements of
``relax_passes/shape_requirements.py``), in memory and in an exported library loaded again.

ONNX Runtime is the reference: on dims an op cannot take it raises; on others our results
equal its. Before the check, the compiled models read past their buffers and returned
garbage (a MatMul whose contraction dim was free, a slice of a 16-row position table past
its end) or crashed (b = 4,000,000).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import aicf_tvm
from aicf_tvm import InputError

from ...helpers import assert_matches_reference, ort_function

_RNG = np.random.default_rng(0)
WEIGHT = _RNG.standard_normal((16, 8)).astype(np.float32)
TABLE = _RNG.standard_normal((16, 8)).astype(np.float32)


def _model(nodes: list, inputs: dict, inits: dict) -> onnx.ModelProto:
    values = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()]
    graph = helper.make_graph(nodes, "g", values,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _by_weight() -> onnx.ModelProto:
    return _model([helper.make_node("MatMul", ["x", "W"], ["y"])], {"x": ["a", "b"]}, {"W": WEIGHT})


def _two_inputs() -> onnx.ModelProto:
    return _model([helper.make_node("MatMul", ["x", "z"], ["y"])],
                  {"x": ["a", "k"], "z": ["k2", "c"]}, {})


def _positions() -> onnx.ModelProto:
    """``x + P[:seq]`` with ``seq`` read from x's shape: TVM's ONNX frontend assumes the slice
    in bounds (a symbolic end)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["n"]),
             helper.make_node("Unsqueeze", ["n", "zero"], ["n1"]),
             helper.make_node("Slice", ["P", "zero", "n1", "zero"], ["p"]),
             helper.make_node("Add", ["x", "p"], ["y"])]
    inits = {"P": TABLE, "one": np.array(1, np.int64), "zero": np.array([0], np.int64)}
    return _model(nodes, {"x": [1, "seq", 8]}, inits)


def _refused_by_ort(model: onnx.ModelProto, *args: np.ndarray) -> None:
    with pytest.raises(Exception) as err:  # ONNX Runtime's own error types
        ort_function(model)(*args)
    assert not isinstance(err.value, AssertionError)


def test_a_free_contraction_dim_is_checked_at_the_call():
    """``--shape x=a,b`` on a MatMul by a 16-row weight: b must be 16."""
    model = _by_weight()
    compiled = aicf_tvm.compile(aicf_tvm.from_onnx(model, shapes={"x": ["a", "b"]}))
    sets = [(_RNG.standard_normal((a, 16)).astype(np.float32),) for a in (3, 3, 5)]
    assert_matches_reference(compiled, ort_function(model), sets, rtol=1e-5, atol=1e-5)
    for b in (40, 4_000_000):
        x = np.zeros((1, b), np.float32)
        _refused_by_ort(model, x)
        with pytest.raises(InputError, match=rf"input x: dim b = {b} \(axis 1\), but matmul of "
                                             r"input x and a constant float32 \[16, 8\] tensor "
                                             r"requires b == 16"):
            compiled(x)


def test_contraction_dims_of_two_inputs_must_agree():
    model = _two_inputs()
    compiled = aicf_tvm.compile(aicf_tvm.from_onnx(model))
    sets = [(_RNG.standard_normal((3, k)).astype(np.float32),
             _RNG.standard_normal((k, 2)).astype(np.float32)) for k in (4, 4, 7)]
    assert_matches_reference(compiled, ort_function(model), sets, rtol=1e-5, atol=1e-5)
    x, z = np.ones((3, 4), np.float32), np.ones((5, 2), np.float32)
    _refused_by_ort(model, x, z)
    with pytest.raises(InputError, match=r"input x: dim k = 4 \(axis 1\), input z: dim k2 = 5 "
                                         r"\(axis 0\), but matmul of input x and input z "
                                         r"requires k == k2"):
        compiled(x, z)


@pytest.fixture(scope="module")
def positions():
    model = _positions()
    return model, aicf_tvm.compile(aicf_tvm.from_onnx(model, bounds={"seq": (1, 40)}))


def test_a_slice_past_the_table_is_refused_within_the_bounds(positions):
    """``seq`` may be up to 40, the table has 16 rows: seq = 17..40 read past its end."""
    model, compiled = positions
    sets = [(_RNG.standard_normal((1, n, 8)).astype(np.float32),) for n in (5, 5, 16)]
    assert_matches_reference(compiled, ort_function(model), sets, rtol=1e-6, atol=1e-6)
    for n in (17, 40):
        x = np.zeros((1, n, 8), np.float32)
        _refused_by_ort(model, x)
        with pytest.raises(InputError, match=rf"input x: dim seq = {n} \(axis 1\), but "
                                             r"strided_slice .* requires seq <= 16"):
            compiled(x)


def test_the_requirements_travel_in_an_exported_library(positions, tmp_path):
    _, compiled = positions
    path = compiled.export(tmp_path / "positions.so")
    loaded = aicf_tvm.load(path)
    assert [str(r) for r in loaded.requirements] == ["seq <= 16"]
    x = _RNG.standard_normal((1, 9, 8)).astype(np.float32)
    np.testing.assert_array_equal(loaded(x), compiled(x))
    with pytest.raises(InputError, match=r"dim seq = 17 .* requires seq <= 16"):
        loaded(np.zeros((1, 17, 8), np.float32))
    probe = (f"import numpy as np, aicf_tvm\nm = aicf_tvm.load({str(path)!r})\n"
             "try:\n    m(np.zeros((1, 30, 8), np.float32))\n"
             "except aicf_tvm.InputError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    assert "input x: dim seq = 30 (axis 1), but strided_slice" in out.stdout
