"""Our converters in TVM's ONNX frontend (``aicf_tvm/driver/frontends/onnx.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

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


def _clip_model(lo: float | None, hi: float | None, hi_input: bool = False) -> onnx.ModelProto:
    """relu(x) then Clip(., lo, hi) (constant bounds, a NaN one, a missing one, or ``hi``
    a graph input)."""
    inits, names = [], []
    for name, value in (("lo", lo), ("hi", hi)):
        if value is None:
            names.append("")
        elif name == "hi" and hi_input:
            names.append("hi")
        else:
            inits.append(onnx.numpy_helper.from_array(np.array(value, np.float32), name))
            names.append(name)
    inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8])]
    if hi_input:
        inputs.append(helper.make_tensor_value_info("hi", onnx.TensorProto.FLOAT, []))
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Clip", ["r", *names], ["y"])],
                              "clip", inputs, [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("lo, hi", [(0.0, 6.0), (-1.0, None), (None, 2.5), (2.0, -1.0)])
def test_clip_to_constant_bounds_fuses_with_the_relu_and_matches_onnx(lo, hi):
    """Constant bounds: our Clip (Relax maximum/minimum, no TE kernel) joins the relu in
    one kernel and gives ONNX's reference evaluator's and ONNX Runtime's values on finite
    inputs, and on NaN, inf and -0.0 inputs the bits of TVM's converter compiled by us
    (NaN through max/min as TVM's kernels give it)."""
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    model = _clip_model(lo, hi)
    compiled = aicf_tvm.compile(aicf_tvm.from_onnx(model), warm_up=False)
    before = aicf_tvm.compile(relax.frontend.onnx.from_onnx(model, keep_params_in_input=False), warm_up=False)
    assert len(compiled.kernels) == 1 < len(before.kernels)
    x = np.random.default_rng(5).standard_normal((2, 8)).astype(np.float32) * 8
    ours = np.asarray(compiled(x))
    np.testing.assert_array_equal(ours, ReferenceEvaluator(model).run(None, {"x": x})[0])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(ours, session.run(None, {"x": x})[0])
    x[0, :5] = [np.nan, np.inf, -np.inf, -0.0, 0.0]
    np.testing.assert_array_equal(np.asarray(compiled(x)).view(np.uint32), np.asarray(before(x)).view(np.uint32))


def test_clip_to_a_nan_bound_is_tvms_converter():
    """A NaN bound (ONNX's reference evaluator: every output NaN; ONNX Runtime and TVM's
    converter: the negative inputs pass a relu before it) stays with TVM's converter."""
    model = _clip_model(np.nan, 6.0)
    ours = aicf_tvm.compile(aicf_tvm.from_onnx(model), warm_up=False)
    before = aicf_tvm.compile(relax.frontend.onnx.from_onnx(model, keep_params_in_input=False), warm_up=False)
    x = np.random.default_rng(7).standard_normal((2, 8)).astype(np.float32) * 8
    np.testing.assert_array_equal(np.asarray(ours(x)).view(np.uint32), np.asarray(before(x)).view(np.uint32))


def test_clip_to_a_bound_given_at_run_time():
    import onnxruntime as ort

    model = _clip_model(0.0, None, hi_input=True)
    compiled = aicf_tvm.compile(aicf_tvm.from_onnx(model), warm_up=False)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(6).standard_normal((2, 8)).astype(np.float32) * 8
    for hi in (np.float32(3.0), np.float32(np.nan), np.float32(-2.0)):
        want = session.run(None, {"x": x, "hi": np.array(hi)})[0]
        np.testing.assert_array_equal(np.asarray(compiled(x, np.array(hi))), want)


def _pad_conv_model(pads: list[int], value: float, mode: str = "constant") -> onnx.ModelProto:
    """Pad (pads and value as inputs, opset 17) then a 3x3 convolution without padding."""
    rng = np.random.default_rng(8)
    inits = [onnx.numpy_helper.from_array(np.array(pads, np.int64), "pads"),
             onnx.numpy_helper.from_array(np.array(value, np.float32), "value"),
             onnx.numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")]
    nodes = [helper.make_node("Pad", ["x", "pads", "value"], ["p"], mode=mode),
             helper.make_node("Conv", ["p", "w"], ["y"], kernel_shape=[3, 3])]
    graph = helper.make_graph(nodes, "padconv", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                              [1, 3, 10, 10])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("pads, value, mode, kernels", [
    ([0, 0, 1, 1, 0, 0, 1, 1], 0.0, "constant", 1),   # "same" padding: the conv's own
    ([0, 0, 0, 1, 0, 0, 2, 1], 0.0, "constant", 1),   # uneven, as TF-style exports write it
    ([0, 0, 1, 1, 0, 0, 1, 1], 1.5, "constant", 2),   # another value: a pad kernel of its own
    ([0, 0, 1, 1, 0, 0, -1, 1], 0.0, "constant", 2),  # a crop: TVM's converter
    ([0, 0, 1, 1, 0, 0, 1, 1], 0.0, "reflect", 2),    # TVM's converter
])
def test_pad_before_a_conv_matches_onnx_runtime(pads, value, mode, kernels):
    import onnxruntime as ort

    model = _pad_conv_model(pads, value, mode)
    compiled = aicf_tvm.compile(aicf_tvm.from_onnx(model), warm_up=False)
    assert len(compiled.kernels) == kernels
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed in (9, 10):
        x = np.random.default_rng(seed).standard_normal((1, 3, 10, 10)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(compiled(x)), session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["llvm", {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell"}])
@pytest.mark.parametrize("a_zero_point, b_zero_point", [(131, None), (None, 0), (7, 3)])
def test_matmul_integer_equals_onnx_reference(a_zero_point, b_zero_point, target):
    """quantize_dynamic's MatMulInteger (uint8 data, constant int8 weight): the int32 sums
    ONNX's reference computes, exactly, on the host's int8 kernel and on AVX2's (haswell);
    a weight zero point other than 0 takes TVM's converter."""
    from aicf_tvm.runtime import cpu_features

    if target != "llvm" and "avx2" not in cpu_features.isa_flags():
        pytest.skip("the CPU has no AVX2")
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(23)
    k, n = 96, 32
    inits = [numpy_helper.from_array(rng.integers(-128, 128, (k, n)).astype(np.int8), "b")]
    names = ["a", "b", "", ""]
    if a_zero_point is not None:
        inits.append(numpy_helper.from_array(np.array(a_zero_point, np.uint8), "azp"))
        names[2] = "azp"
    if b_zero_point is not None:
        inits.append(numpy_helper.from_array(np.array(b_zero_point, np.int8), "bzp"))
        names[3] = "bzp"
    while names and not names[-1]:
        names.pop()
    graph = helper.make_graph([helper.make_node("MatMulInteger", names, ["y"])], "mmi",
                              [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 20, k])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    compiled = aicf_tvm.compile(model, target=target, cache=False)
    from aicf_tvm.runtime.targets import resolve_target
    from schedules.cpu.conv2d_int8 import int8_dot

    integer = any(kernel.schedule == "VNNIMatmul" for kernel in compiled.kernels)
    assert integer == (not b_zero_point and int8_dot(resolve_target(target)) is not None)
    reference = ReferenceEvaluator(model)
    outputs = []
    for _ in range(2):
        a = rng.integers(0, 256, (1, 20, k)).astype(np.uint8)
        got = np.asarray(compiled(a))
        np.testing.assert_array_equal(got, reference.run(None, {"a": a})[0])
        outputs.append(got)
    assert not np.array_equal(*outputs)


def _col2im_model(block, image, strides, dilations, pads, channels=3, batch="n") -> tuple[onnx.ModelProto, int]:
    """Col2Im of an input [batch, channels * kh * kw, L] into ``image`` (opset 18)."""
    (kh, kw), (h, w) = block, image
    nh = (h + pads[0] + pads[2] - (dilations[0] * (kh - 1) + 1)) // strides[0] + 1
    nw = (w + pads[1] + pads[3] - (dilations[1] * (kw - 1) + 1)) // strides[1] + 1
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], strides=strides, dilations=dilations, pads=pads)
    graph = helper.make_graph(
        [node], "col2im", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [batch, channels * kh * kw,
                                                                                          nh * nw])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        initializer=[onnx.numpy_helper.from_array(np.array(image, np.int64), "image"),
                     onnx.numpy_helper.from_array(np.array(block, np.int64), "block")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), nh * nw


@pytest.mark.parametrize("block, image, strides, dilations, pads", [
    ((2, 2), (8, 6), [2, 2], [1, 1], [0, 0, 0, 0]),  # MobileViTV2's fold: blocks side by side
    ((3, 3), (7, 7), [1, 1], [1, 1], [1, 1, 1, 1]),  # overlapping, padded
    ((2, 3), (9, 8), [2, 1], [2, 1], [0, 1, 1, 0]),  # dilated rows, uneven pads
])
def test_col2im_matches_onnx_runtime_and_pytorch_fold(block, image, strides, dilations, pads):
    """TVM's frontend has no Col2Im: ours gives ONNX Runtime's values on two batches, with
    PyTorch's ``F.fold`` (where its padding is symmetric) as a second reference, and the
    bits of ORT where -0.0 and overlapping blocks meet (zero + contributions in order)."""
    import onnxruntime as ort
    import torch

    model, blocks = _col2im_model(block, image, strides, dilations, pads)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    compiled = aicf_tvm.compile(aicf_tvm.from_onnx(model), cache=False)
    rng = np.random.default_rng(3)
    outs = []
    for batch in (1, 2):
        x = rng.standard_normal((batch, 3 * block[0] * block[1], blocks)).astype(np.float32)
        got = np.asarray(compiled(x))
        np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-6, atol=1e-6)
        if pads[:2] == pads[2:]:
            fold = torch.nn.functional.fold(torch.from_numpy(x).double(), image, block, dilation=dilations,
                                            padding=pads[:2], stride=strides).numpy()
            np.testing.assert_allclose(got, fold, rtol=1e-5, atol=1e-6)
        outs.append(got)
    assert outs[0].shape[0] == 1 and outs[1].shape[0] == 2
    zeros = np.full((1, 3 * block[0] * block[1], blocks), -0.0, np.float32)
    np.testing.assert_array_equal(np.signbit(np.asarray(compiled(zeros))),
                                  np.signbit(session.run(None, {"x": zeros})[0]))


def test_col2im_with_an_image_shape_given_at_run_time_is_refused_by_name():
    model, _ = _col2im_model((2, 2), (4, 4), [2, 2], [1, 1], [0, 0, 0, 0])
    del model.graph.initializer[0]
    model.graph.input.append(helper.make_tensor_value_info("image", onnx.TensorProto.INT64, [2]))
    with pytest.raises(aicf_tvm.UnsupportedModelError, match="Col2Im with an image or block shape computed at run"):
        aicf_tvm.from_onnx(model)


def test_gather_nd_by_indices_folded_from_the_shape_keeps_int64_indices():
    """Indices made of a constant and the data's shape (``where(c < 0, c + shape, c)``,
    PyTorch's dynamo exporter's ``aten.index`` of a mask): the import folds them to a
    constant and its bounds check is decided at compile time, where ``relax.const`` would
    make the checked int64 indices int32, which Relax's ``gather_nd`` refuses. Matches ONNX
    Runtime, a negative index counted from the end."""
    import onnxruntime as ort

    const = np.array([[0, 1], [0, -3], [0, 6], [0, -8]], np.int64)
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Less", ["c", "zero"], ["negative"]),
             helper.make_node("Add", ["c", "shape"], ["wrapped"]),
             helper.make_node("Where", ["negative", "wrapped", "c"], ["indices"]),
             helper.make_node("GatherND", ["x", "indices"], ["y"])]
    graph = helper.make_graph(
        nodes, "gather_nd", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        initializer=[onnx.numpy_helper.from_array(const, "c"),
                     onnx.numpy_helper.from_array(np.array(0, np.int64), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    compiled = aicf_tvm.compile(aicf_tvm.from_onnx(model), cache=False)
    for seed in (0, 1):
        x = np.random.default_rng(seed).standard_normal((1, 8)).astype(np.float32)
        np.testing.assert_array_equal(np.asarray(compiled(x)), session.run(None, {"x": x})[0])
