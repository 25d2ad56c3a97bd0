"""Shape folding before TVM's ONNX frontend (``aicf_tvm/driver/frontends/onnx_fold.py``)."""

from __future__ import annotations

import numpy as np
import pytest

import aicf_tvm
from aicf_tvm.driver.frontends.onnx_fold import fold_shapes

onnx = pytest.importorskip("onnx")
helper = onnx.helper


def _model_with_a_stale_type() -> onnx.ModelProto:
    """``reshape(x + table[[0]], [-1, 2])`` whose gathered row carries the type an exporter
    left (its first dim unknown: ConvBERT's token-type embedding): the gather folds to an
    initializer [1, 4]; the old entry, kept, made every value after it of unknown shape,
    and TVM's Reshape refused to infer its -1."""
    table = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    nodes = [helper.make_node("Constant", [], ["row"], value=helper.make_tensor("r", onnx.TensorProto.INT64, [1], [0])),
             helper.make_node("Gather", ["table", "row"], ["picked"], axis=0),
             helper.make_node("Add", ["x", "picked"], ["sum"]),
             helper.make_node("Reshape", ["sum", "shape"], ["y"])]
    graph = helper.make_graph(
        nodes, "stale", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        initializer=[onnx.numpy_helper.from_array(table, "table"),
                     onnx.numpy_helper.from_array(np.array([-1, 2], np.int64), "shape")],
        value_info=[helper.make_tensor_value_info("picked", onnx.TensorProto.FLOAT, ["unk__0", 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_folded_value_loses_its_stale_type_and_the_model_imports():
    model = _model_with_a_stale_type()
    folded = fold_shapes(model)
    assert "picked" in {init.name for init in folded.graph.initializer}
    assert "picked" not in {info.name for info in folded.graph.value_info}
    compiled = aicf_tvm.compile(aicf_tvm.from_onnx(model))
    for x in (np.array([[1, 2, 3, 4]], np.float32), np.array([[-1, 0, 0.5, 8]], np.float32)):
        np.testing.assert_array_equal(np.asarray(compiled(x)), (x + np.float32([-5, -4, -3, -2])).reshape(-1, 2))


def _model_with_weights() -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """``x @ W + table[[3]]`` whose ``W`` and ``table`` are weights (above
    ``MAX_FOLDED_ELEMENTS`` elements: folded without their data) and whose gathered row
    folds by reading the table."""
    from aicf_tvm.driver.frontends.onnx_fold import MAX_FOLDED_ELEMENTS

    rng = np.random.default_rng(3)
    weight = rng.standard_normal((8, MAX_FOLDED_ELEMENTS // 8 + 16)).astype(np.float32)
    table = rng.standard_normal((MAX_FOLDED_ELEMENTS // weight.shape[1] + 64, weight.shape[1])).astype(np.float32)
    nodes = [helper.make_node("Constant", [], ["row"], value=helper.make_tensor("r", onnx.TensorProto.INT64, [1], [3])),
             helper.make_node("Gather", ["table", "row"], ["picked"], axis=0),
             helper.make_node("MatMul", ["x", "W"], ["xw"]),
             helper.make_node("Add", ["xw", "picked"], ["y"])]
    graph = helper.make_graph(
        nodes, "weights", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        initializer=[onnx.numpy_helper.from_array(weight, "W"), onnx.numpy_helper.from_array(table, "table")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), weight, table


def test_weights_are_folded_without_their_data_and_come_back_whole():
    model, weight, table = _model_with_weights()
    before = model.SerializeToString()
    folded = fold_shapes(model)
    assert model.SerializeToString() == before  # the given model is not changed
    inits = {init.name: onnx.numpy_helper.to_array(init) for init in folded.graph.initializer}
    np.testing.assert_array_equal(inits["W"], weight)
    np.testing.assert_array_equal(inits["picked"], table[[3]])  # read from the weight to fold
    x = np.random.default_rng(4).standard_normal((2, 8)).astype(np.float32)
    y = np.asarray(aicf_tvm.compile(aicf_tvm.from_onnx(model))(x))
    np.testing.assert_allclose(y, x.astype(np.float64) @ weight + table[[3]], rtol=1e-5, atol=1e-5)


def test_the_onnx_checker_runs_on_the_graph_without_the_weights_bytes():
    """TVM's frontend ran ``check_model`` on the whole model (serializing every weight);
    ours checks the folded graph with empty weights: the same finding, a warning as
    TVM gives it, and the model still imports with its weights whole."""
    from aicf_tvm.driver.frontends.onnx_fold import weightless

    model, weight, table = _model_with_weights()
    del model.graph.output[:]  # the checker wants the output's shape
    model.graph.output.append(helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, weight.shape[1]]))
    onnx.checker.check_model(model)
    model.graph.node[2].attribute.append(helper.make_attribute("bogus", 1))  # MatMul has no such attribute
    with pytest.raises(onnx.checker.ValidationError, match="bogus"):
        onnx.checker.check_model(model)
    seen = []
    folded = fold_shapes(model, check=seen.append)
    light = seen[0]
    assert [list(i.dims) for i in light.graph.initializer if i.name == "W"] == [[0]]  # the table: folded away
    assert not any(i.raw_data for i in light.graph.initializer if i.name == "W")
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(next(i for i in folded.graph.initializer
                                                                   if i.name == "W")), weight)
    assert weightless(folded, {}).SerializeToString() == folded.SerializeToString()  # no weight named: a copy
    with pytest.warns(UserWarning, match="bogus"):
        mod = aicf_tvm.from_onnx(model)
    x = np.random.default_rng(5).standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(aicf_tvm.compile(mod)(x)), x.astype(np.float64) @ weight + table[[3]],
                               rtol=1e-5, atol=1e-5)


def _model_with_nonzero(mask_is_input: bool) -> onnx.ModelProto:
    """``x[:, nonzero(mask)][:, -1:]`` broadcast to [3, 2, 1] (Longformer's exported
    attention windows): with a constant mask the indices are constants; with the mask an
    input they are known only at run time."""
    nodes = [helper.make_node("NonZero", ["mask"], ["nz"]),
             helper.make_node("Reshape", ["nz", "flat"], ["idx"]),
             helper.make_node("Gather", ["x", "idx"], ["picked"], axis=1),
             helper.make_node("Slice", ["picked", "start", "end", "axes"], ["last"]),
             helper.make_node("Expand", ["last", "out_shape"], ["y"])]
    consts = {"flat": np.array([-1], np.int64), "start": np.array([-1], np.int64),
              "end": np.array([np.iinfo(np.int64).max], np.int64), "axes": np.array([1], np.int64),
              "out_shape": np.array([3, 2, 1], np.int64)}
    inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 5])]
    if mask_is_input:
        inputs.append(helper.make_tensor_value_info("mask", onnx.TensorProto.BOOL, [5]))
    else:
        consts["mask"] = np.array([False, True, True, False, True])
    output = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "nonzero", inputs, [output],
                              initializer=[onnx.numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_nonzero_of_constants_folds_and_its_indices_are_static():
    """NonZero is exact and deterministic: of a constant it is a constant, so the shapes
    after it are static (unfolded, TVM's shape analysis crashed on the slice to INT64_MAX
    of a data-dependent length)."""
    ort = pytest.importorskip("onnxruntime")
    model = _model_with_nonzero(mask_is_input=False)
    folded = fold_shapes(model)
    assert "NonZero" not in {n.op_type for n in folded.graph.node}
    np.testing.assert_array_equal(next(onnx.numpy_helper.to_array(i) for i in folded.graph.initializer
                                       if i.name == "idx"), [1, 2, 4])
    compiled = aicf_tvm.compile(aicf_tvm.from_onnx(model))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(6)
    outs = []
    for _ in range(2):
        x = rng.standard_normal((2, 5)).astype(np.float32)
        outs.append(np.asarray(compiled(x)))
        np.testing.assert_array_equal(outs[-1], sess.run(None, {"x": x})[0])
    assert not np.array_equal(outs[0], outs[1])


def test_a_nonzero_of_an_input_is_left_to_run_time():
    ort = pytest.importorskip("onnxruntime")
    model = _model_with_nonzero(mask_is_input=True)
    assert "NonZero" in {n.op_type for n in fold_shapes(model).graph.node}
    compiled = aicf_tvm.compile(aicf_tvm.from_onnx(model))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(7).standard_normal((2, 5)).astype(np.float32)
    for mask in ([0, 1, 1, 0, 1], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]):
        feeds = {"x": x, "mask": np.array(mask, bool)}
        np.testing.assert_array_equal(np.asarray(compiled(**feeds)), sess.run(None, feeds)[0])


def test_a_chain_of_computed_reshapes_folds_to_its_end():
    """Each layer's reshape target is computed from the shape of the layer before
    (``Shape -> Slice -> Div -> Concat -> Reshape``): each fold round makes one more layer's shape
    static; all of them fold, however many layers (the rounds once stopped at 8), and the
    model matches ONNX Runtime."""
    ort = pytest.importorskip("onnxruntime")
    layers = 20
    nodes, inits, x = [], [], "x"
    inits.append(onnx.numpy_helper.from_array(np.array([0], np.int64), "zero"))
    inits.append(onnx.numpy_helper.from_array(np.array([1], np.int64), "one"))
    inits.append(onnx.numpy_helper.from_array(np.array([-1], np.int64), "minus_one"))
    inits.append(onnx.numpy_helper.from_array(np.array([1.5], np.float32), "one_f"))
    for i in range(layers):
        shape, batch, target, y = f"shape{i}", f"batch{i}", f"target{i}", f"y{i}"
        nodes += [helper.make_node("Shape", [x], [shape]),
                  helper.make_node("Slice", [shape, "zero", "one"], [f"s{i}"]),
                  helper.make_node("Div", [f"s{i}", "one"], [batch]),  # ONNX's data propagation stops here
                  helper.make_node("Concat", [batch, "minus_one"], [target], axis=0),
                  helper.make_node("Reshape", [x, target], [f"r{i}"]),
                  helper.make_node("Add", [f"r{i}", "one_f"], [y])]
        x = y
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 4])],
                              [helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert "Shape" not in {n.op_type for n in fold_shapes(model).graph.node}
    compiled = aicf_tvm.compile(aicf_tvm.from_onnx(model))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    v = np.random.default_rng(8).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(compiled(v)), sess.run(None, {"x": v})[0])
