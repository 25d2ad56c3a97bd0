"""Frontends: ONNX and PyTorch models compile and agree with their own runtimes; bad files are
UnsupportedModelErrors that name the file (and the op and node for an unsupported operator)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import aicf_tvm
from aicf_tvm import UnsupportedModelError
from aicf_tvm.frontends import load_model

from ..helpers import assert_matches_reference, ort_function, torch_function
from .test_cli import unsupported_op_model


def small_onnx_mlp() -> onnx.ModelProto:
    """x[2, 8] @ w[8, 16] + b, relu, softmax: a model ONNX Runtime and AICF both run."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"], name="mm"),
             helper.make_node("Add", ["xw", "b"], ["h"], name="bias"),
             helper.make_node("Relu", ["h"], ["r"], name="act"),
             helper.make_node("Softmax", ["r"], ["y"], name="sm", axis=-1)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_from_onnx_matches_onnxruntime():
    pytest.importorskip("onnxruntime")
    model = small_onnx_mlp()
    compiled = aicf_tvm.compile(aicf_tvm.from_onnx(model))
    assert [s.name for s in compiled.inputs] == ["x"]
    rng = np.random.default_rng(1)
    inputs = [[rng.standard_normal((2, 8)).astype(np.float32)] for _ in range(2)]
    assert_matches_reference(compiled, ort_function(model), inputs, rtol=1e-4, atol=1e-5)


def test_from_torch_matches_torch():
    torch = pytest.importorskip("torch")

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)
            self.norm = torch.nn.LayerNorm(8)

        def forward(self, x):
            return self.norm(self.fc2(torch.nn.functional.gelu(self.fc1(x))))

    torch.manual_seed(0)
    module = Block().eval()
    x = torch.randn(4, 16)
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(module, (x,)))
    inputs = [[x.numpy()], [torch.randn(4, 16).numpy()]]
    assert_matches_reference(compiled, torch_function(module), inputs, rtol=1e-4, atol=1e-5)


def test_missing_file_names_it(tmp_path):
    with pytest.raises(UnsupportedModelError, match=r"nope\.onnx: no such file"):
        aicf_tvm.from_onnx(tmp_path / "nope.onnx")


def test_file_that_is_not_onnx_names_it(tmp_path):
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"\x00\x01 definitely not protobuf")
    with pytest.raises(UnsupportedModelError, match=r"junk\.onnx: not an ONNX model"):
        load_model(path)


def test_unsupported_operator_names_op_and_node():
    with pytest.raises(UnsupportedModelError, match=r"operator FancyOp \(node mystery_node\)"):
        aicf_tvm.from_onnx(unsupported_op_model())


def test_unknown_model_spec_lists_the_built_ins():
    with pytest.raises(UnsupportedModelError, match=r"not a built-in model \(.*encoder_layer"):
        load_model("no_such_model")
