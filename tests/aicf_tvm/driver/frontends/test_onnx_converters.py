"""Our converters in TVM's ONNX frontend (``aicf_tvm/driver/frontends/onnx.py``)."""

from __future__ import annotations

import numpy as np
import pytest

import aicf_tvm

onnx = pytest.importorskip("onnx")
helper = onnx.helper


def test_expand_of_symbolic_dims_to_a_constant_shape_matches_numpy():
    """TVM's Expand reads the data's dims as integers ('Max' object has no attribute
    'value' on Longformer's NonZero counts; a named dim too): each output dim is the
    target's, or the data's where the target has 1."""
    nodes = [helper.make_node("Expand", ["x", "shape"], ["y"])]
    graph = helper.make_graph(
        nodes, "expand", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        initializer=[onnx.numpy_helper.from_array(np.array([2, 1, 4], np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = aicf_tvm.compile(aicf_tvm.from_onnx(model))
    for n in (3, 5):
        x = np.arange(n, dtype=np.float32).reshape(n, 1) - 1.5
        np.testing.assert_array_equal(np.asarray(compiled(x)), np.broadcast_to(x, (2, n, 4)))
