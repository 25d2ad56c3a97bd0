"""``relax_passes.integer_qdq``: a QDQ convolution runs in integers and gives what ONNX's
reference ``QLinearConv`` gives, bit for bit; what the pass cannot prove stays the float
graph; every other quantize / dequantize computes what ONNX's reference computes; a QDQ
network compiled so is at least as close to its float32 original as ONNX Runtime is."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import aicf_tvm
from aicf_tvm.core.options import CompileOptions
from aicf_tvm.runtime import cpu_features
from aicf_tvm.runtime.targets import resolve_target
from relax_passes import legalize_int8_matmul
from relax_passes.integer_qdq import QDQ_INTEGER
from relax_passes.legalize_int8_matmul import padded_rows, pairs_form
from schedules.cpu.amx_int8 import has_amx_int8
from schedules.cpu.conv2d_int8 import has_vnni

needs_vnni = pytest.mark.skipif(not has_vnni(resolve_target("llvm")), reason="the CPU has no AVX-512 VNNI")

C, O, HW = 32, 48, 9


def _const(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _params(rng: np.random.Generator, per_channel: bool, zx: int, zy: int) -> dict:
    wq = rng.integers(-127, 128, (O, C, 3, 3)).astype(np.int8)
    sw = (rng.uniform(0.002, 0.01, O) if per_channel else np.array(0.004)).astype(np.float32)
    sx, sy = np.float32(0.021), np.float32(0.37)
    bq = rng.integers(-20000, 20000, O).astype(np.int32)
    return {"wq": wq, "sw": sw, "sx": sx, "zx": np.uint8(zx), "sy": sy, "zy": np.uint8(zy),
            "bq": bq, "sb": (sx * np.broadcast_to(sw, (O,))).astype(np.float32)}


def _qdq_conv(p: dict, pads: int, stride: int, relu: bool) -> onnx.ModelProto:
    """uint8 input -> DequantizeLinear -> Conv(DQ(int8 weight), DQ(int32 bias)) [-> Relu] -> QuantizeLinear."""
    inits = [_const("wq", p["wq"]), _const("sw", p["sw"]), _const("sx", p["sx"]), _const("zx", p["zx"]),
             _const("sy", p["sy"]), _const("zy", p["zy"]), _const("bq", p["bq"]), _const("sb", p["sb"]),
             _const("zw", np.zeros(p["sw"].shape, np.int8)), _const("zb", np.zeros(O, np.int32))]
    nodes = [helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["x"]),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["w"], axis=0),
             helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["b"], axis=0),
             helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pads] * 4, strides=[stride] * 2)]
    last = "c"
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["r"]))
        last = "r"
    nodes.append(helper.make_node("QuantizeLinear", [last, "sy", "zy"], ["yq"]))
    graph = helper.make_graph(nodes, "qdq_conv",
                              [helper.make_tensor_value_info("xq", TensorProto.UINT8, [1, C, HW, HW])],
                              [helper.make_tensor_value_info("yq", TensorProto.UINT8, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def _qlinear_conv(p: dict, pads: int, stride: int, relu: bool) -> onnx.ModelProto:
    """The same convolution as ONNX's QLinearConv (Relu as its output clamp at ``zy``)."""
    inits = [_const(k, p[k]) for k in ("wq", "sw", "sx", "zx", "sy", "zy", "bq")] + [
        _const("zw", np.zeros(p["sw"].shape, np.int8))]
    nodes = [helper.make_node("QLinearConv", ["xq", "sx", "zx", "wq", "sw", "zw", "sy", "zy", "bq"], ["yq"],
                              pads=[pads] * 4, strides=[stride] * 2)]
    graph = helper.make_graph(nodes, "qlinear_conv",
                              [helper.make_tensor_value_info("xq", TensorProto.UINT8, [1, C, HW, HW])],
                              [helper.make_tensor_value_info("yq", TensorProto.UINT8, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


@needs_vnni
@pytest.mark.parametrize("per_channel, zx, zy, pads, stride, relu", [
    (True, 0, 3, 1, 1, True),      # a ReLU block: padded input (zero point 0), clamped at zy
    (True, 0, 131, 1, 2, False),   # strided, output zero point
    (False, 77, 9, 0, 1, False),   # input zero point (no padding), weight scale per tensor
])
def test_a_qdq_conv_runs_in_integers_and_equals_qlinear_conv(per_channel, zx, zy, pads, stride, relu):
    rng = np.random.default_rng(7)
    p = _params(rng, per_channel, zx, zy)
    model = aicf_tvm.compile(_qdq_conv(p, pads, stride, relu), cache=False)
    taken = [d for d in model.report.decisions if d.candidate == QDQ_INTEGER]
    assert [d.accepted for d in taken] == [True], [str(d) for d in taken]
    assert any(k.schedule == "VNNIConv2d" for k in model.kernels), [k.schedule for k in model.kernels]
    reference = ReferenceEvaluator(_qlinear_conv(p, pads, stride, relu))
    outputs = []
    for _ in range(2):
        xq = rng.integers(0, 256, (1, C, HW, HW)).astype(np.uint8)
        want = reference.run(None, {"xq": xq})[0]
        if relu:  # Relu before QuantizeLinear: the output clamps at zy (QLinearConv has no activation)
            want = np.maximum(want, p["zy"])
        got = np.asarray(model(xq))
        assert got.dtype == np.uint8 and got.shape == want.shape
        assert 0 < np.count_nonzero((want != want.min()) & (want != want.max()))  # not all saturated
        np.testing.assert_array_equal(got, want)
        outputs.append(got)
    assert not np.array_equal(*outputs)


def test_a_padded_input_with_a_nonzero_zero_point_keeps_the_float_graph():
    rng = np.random.default_rng(3)
    p = _params(rng, True, 100, 128)
    onnx_model = _qdq_conv(p, 1, 1, False)
    model = aicf_tvm.compile(onnx_model, cache=False)
    taken = [d for d in model.report.decisions if d.candidate == QDQ_INTEGER]
    assert len(taken) == 1 and not taken[0].accepted and "zero point" in taken[0].note
    assert QDQ_INTEGER not in [d.candidate for d in model.report.approximations]
    xq = rng.integers(0, 256, (1, C, HW, HW)).astype(np.uint8)
    want = ReferenceEvaluator(onnx_model).run(None, {"xq": xq})[0]  # the float graph, in float32
    got = np.asarray(model(xq))
    # float sums in another order: a sum that lands within rounding of a half step may differ by one
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    assert np.mean(got == want) > 0.99


def test_qdq_integer_off_keeps_every_convolution_float():
    rng = np.random.default_rng(5)
    p = _params(rng, True, 0, 0)
    model = aicf_tvm.compile(_qdq_conv(p, 1, 1, True), cache=False, options=CompileOptions(qdq_integer=False))
    assert not model.report.approximations
    assert not any(k.schedule == "VNNIConv2d" for k in model.kernels)


def _qdq_add() -> onnx.ModelProto:
    """float -> Q -> DQ, twice, added, Q: the residual add of a QDQ network (int8 and uint8, per-channel scale)."""
    inits = [_const("sa", np.float32(0.013)), _const("za", np.uint8(121)),
             _const("sb", np.linspace(0.01, 0.03, 8).astype(np.float32)), _const("zb", np.full(8, -3, np.int8)),
             _const("sy", np.float32(0.029)), _const("zy", np.int8(5))]
    nodes = [helper.make_node("QuantizeLinear", ["a", "sa", "za"], ["aq"]),
             helper.make_node("DequantizeLinear", ["aq", "sa", "za"], ["ad"]),
             helper.make_node("QuantizeLinear", ["b", "sb", "zb"], ["bq"], axis=1),
             helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bd"], axis=1),
             helper.make_node("Add", ["ad", "bd"], ["s"]),
             helper.make_node("QuantizeLinear", ["s", "sy", "zy"], ["yq"])]
    shape = [2, 8, 5, 7]
    graph = helper.make_graph(nodes, "qdq_add",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "ab"],
                              [helper.make_tensor_value_info("yq", TensorProto.INT8, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def test_quantize_and_dequantize_compute_what_onnx_defines():
    onnx_model = _qdq_add()
    model = aicf_tvm.compile(onnx_model, cache=False)
    reference = ReferenceEvaluator(onnx_model)
    rng = np.random.default_rng(11)
    for scale in (1.0, 4.0):  # in range, and saturating at both ends
        a = (rng.standard_normal((2, 8, 5, 7)) * scale).astype(np.float32)
        b = (rng.standard_normal((2, 8, 5, 7)) * scale).astype(np.float32)
        a.flat[:4] = [0.5 * 0.013, 1.5 * 0.013, -2.5 * 0.013, 0.0]  # ties: round half to even
        want = reference.run(None, {"a": a, "b": b})[0]
        got = np.asarray(model(a, b))
        assert got.dtype == np.int8
        np.testing.assert_array_equal(got, want)


@needs_vnni
def test_a_quantized_network_is_as_close_to_float32_as_onnx_runtime(tmp_path):
    """A small residual convnet, quantized by ONNX Runtime's ``quantize_static``: ours
    (integer convolutions) and ONNX Runtime each against the float32 model."""
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = torch.nn.Conv2d(16, 32, 3, padding=1)
            self.a = torch.nn.Conv2d(32, 32, 3, padding=1)
            self.b = torch.nn.Conv2d(32, 32, 1)
            self.head = torch.nn.Conv2d(32, 16, 3, stride=2, padding=1)

        def forward(self, x):
            y = torch.relu(self.stem(x))
            y = torch.relu(self.b(torch.relu(self.a(y))) + y)
            return self.head(y)

    torch.manual_seed(0)
    net = Net().eval()
    fp32, int8 = tmp_path / "net.onnx", tmp_path / "net-qdq.onnx"
    torch.onnx.export(net, (torch.randn(1, 16, 20, 20),), str(fp32), input_names=["x"], dynamo=False)
    rng = np.random.default_rng(0)

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": rng.standard_normal((1, 16, 20, 20)).astype(np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(str(fp32), str(int8), Batches(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    model = aicf_tvm.compile(str(int8), cache=False)
    assert len(model.report.approximations) >= 3  # the convolutions after the stem's ReLU
    float_session = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"])
    int8_session = ort.InferenceSession(str(int8), providers=["CPUExecutionProvider"])
    ours_err, ort_err, first = [], [], None
    for _ in range(6):
        x = rng.standard_normal((1, 16, 20, 20)).astype(np.float32)
        ref = float_session.run(None, {"x": x})[0]
        first = ref if first is None else first
        ours_err.append(np.linalg.norm(np.asarray(model(x)) - ref) / np.linalg.norm(ref))
        ort_err.append(np.linalg.norm(int8_session.run(None, {"x": x})[0] - ref) / np.linalg.norm(ref))
    assert not np.allclose(first, ref)
    assert np.mean(ours_err) < 0.1  # an int8 model, near its float32 original
    assert np.mean(ours_err) <= 1.05 * np.mean(ort_err), (ours_err, ort_err)


def _qdq_matmul(rng: np.random.Generator, rows: int, k: int, n: int) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(uint8 rows -> DQ -> MatMul(DQ(int8 weight, per column)) -> Q, the same QLinearMatMul)."""
    wq = rng.integers(-127, 128, (k, n)).astype(np.int8)
    consts = {"wq": wq, "sw": rng.uniform(0.002, 0.01, n).astype(np.float32), "zw": np.zeros(n, np.int8),
              "sx": np.float32(0.02), "zx": np.uint8(119), "sy": np.float32(0.05 * (k / 64) ** 0.5),
              "zy": np.uint8(128)}
    inits = [_const(name, value) for name, value in consts.items()]
    x_info = helper.make_tensor_value_info("xq", TensorProto.UINT8, [1, rows, k])
    y_info = helper.make_tensor_value_info("yq", TensorProto.UINT8, None)
    qdq = helper.make_model(helper.make_graph([
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["x"]),
        helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["w"], axis=1),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("QuantizeLinear", ["y", "sy", "zy"], ["yq"])], "qdq_matmul", [x_info], [y_info], inits),
        opset_imports=[helper.make_opsetid("", 19)])
    qlinear = helper.make_model(helper.make_graph([
        helper.make_node("QLinearMatMul", ["xq", "sx", "zx", "wq", "sw", "zw", "sy", "zy"], ["yq"])],
        "qlinear_matmul", [x_info], [y_info], inits), opset_imports=[helper.make_opsetid("", 19)])
    return qdq, qlinear


@needs_vnni
# VNNI; whole AMX blocks where the CPU has AMX; rows padded to whole tiles (13 -> 16, 37 -> 64: AMX)
@pytest.mark.parametrize("rows, k, n", [(24, 64, 48), (64, 192, 96), (13, 64, 32), (37, 128, 32)])
def test_a_qdq_matmul_runs_in_integers_and_equals_qlinear_matmul(rows, k, n):
    rng = np.random.default_rng(13)
    qdq, qlinear = _qdq_matmul(rng, rows, k, n)
    model = aicf_tvm.compile(qdq, cache=False)
    assert [d.accepted for d in model.report.decisions if d.candidate == QDQ_INTEGER] == [True]
    assert any(k.schedule == "VNNIMatmul" for k in model.kernels), [k.schedule for k in model.kernels]
    tiles = "tdpbusd" in str(model.lowered)
    assert tiles == (padded_rows(rows) % 32 == 0 and has_amx_int8(resolve_target("llvm"))), tiles
    reference = ReferenceEvaluator(qlinear)
    outputs = []
    for _ in range(2):
        xq = rng.integers(0, 256, (1, rows, k)).astype(np.uint8)
        want = reference.run(None, {"xq": xq})[0]
        got = np.asarray(model(xq))
        assert 0 < np.count_nonzero((want != 0) & (want != 255))
        np.testing.assert_array_equal(got, want)
        outputs.append(got)
    assert not np.array_equal(*outputs)


@pytest.mark.skipif(not has_amx_int8(resolve_target("llvm")), reason="the CPU has no AMX int8")
def test_an_amx_library_runs_in_a_fresh_process(tmp_path):
    """A process that never compiled has no AMX permission: each AMX kernel asks for it."""
    rng = np.random.default_rng(17)
    qdq, _ = _qdq_matmul(rng, 64, 128, 64)
    model = aicf_tvm.compile(qdq, cache=False)
    assert "tdpbusd" in str(model.lowered)
    xq = rng.integers(0, 256, (1, 64, 128)).astype(np.uint8)
    np.save(tmp_path / "x.npy", xq)
    np.save(tmp_path / "want.npy", np.asarray(model(xq)))
    model.export(str(tmp_path / "m.so"))
    code = ("import sys, numpy as np, aicf_tvm\n"
            f"m = aicf_tvm.load({str(tmp_path / 'm.so')!r})\n"
            f"got = np.asarray(m(np.load({str(tmp_path / 'x.npy')!r})))\n"
            "assert 'schedules.cpu.amx_int8' not in sys.modules\n"
            f"print(np.array_equal(got, np.load({str(tmp_path / 'want.npy')!r})))\n")
    run = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert run.stdout.strip().endswith("True")


def test_a_requantized_pad_is_the_pad_and_folds_into_the_convolution():
    """DQ -> Pad(0) -> Q -> DQ (same scale and zero point) -> depthwise Conv: the pair after
    the pad is dropped (the values it passes are unchanged), so the pad joins the conv;
    the output is the QDQ graph's, as ONNX's reference evaluates it."""
    rng = np.random.default_rng(19)
    channels = 16
    consts = {"s": np.float32(0.043), "z": np.uint8(7), "pads": np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64),
              "w": rng.standard_normal((channels, 1, 3, 3)).astype(np.float32)}
    nodes = [helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["x"]),
             helper.make_node("Pad", ["x", "pads"], ["p"], mode="constant"),
             helper.make_node("QuantizeLinear", ["p", "s", "z"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "s", "z"], ["pd"]),
             helper.make_node("Conv", ["pd", "w"], ["y"], group=channels, strides=[2, 2])]
    graph = helper.make_graph(nodes, "qdq_pad",
                              [helper.make_tensor_value_info("xq", TensorProto.UINT8, [1, channels, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [_const(k, v) for k, v in consts.items()])
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model = aicf_tvm.compile(onnx_model, cache=False)
    convs = [k for k in model.kernels if "conv2d" in k.kind]
    assert len(convs) == 1 and not any("pad" in k.kind for k in model.kernels), model.kernels
    signature = next(line for line in str(model.lowered[convs[0].name]).splitlines() if "def main" in line)
    assert "T.int64(12), T.int64(12)" in signature and "T.int64(13)" not in signature  # reads the unpadded input
    reference = ReferenceEvaluator(onnx_model)
    for _ in range(2):
        xq = rng.integers(0, 256, (1, channels, 12, 12)).astype(np.uint8)
        want = reference.run(None, {"xq": xq})[0]
        np.testing.assert_allclose(np.asarray(model(xq)), want, rtol=1e-5, atol=1e-5)


@needs_vnni
def test_a_bias_of_another_scale_is_added_before_the_rounding():
    """MatMul + a bias dequantized by its own scale (not the sums'): integer sums, the bias
    added in the float64 rescale; within one unit of the float graph, equal almost everywhere."""
    rng = np.random.default_rng(29)
    k, n = 64, 32
    consts = {"wq": rng.integers(-127, 128, (k, n)).astype(np.int8), "sw": np.float32(0.004), "zw": np.int8(0),
              "sx": np.float32(0.02), "zx": np.uint8(120), "sy": np.float32(0.06), "zy": np.uint8(128),
              "bq": rng.integers(-3000, 3000, n).astype(np.int32), "sb": np.float32(0.0007), "zb": np.int32(0)}
    nodes = [helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["x"]),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["w"]),
             helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["b"]),
             helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["y"]),
             helper.make_node("QuantizeLinear", ["y", "sy", "zy"], ["yq"])]
    graph = helper.make_graph(nodes, "qdq_bias", [helper.make_tensor_value_info("xq", TensorProto.UINT8, [1, 16, k])],
                              [helper.make_tensor_value_info("yq", TensorProto.UINT8, None)],
                              [_const(name, value) for name, value in consts.items()])
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model = aicf_tvm.compile(onnx_model, cache=False)
    taken = [d for d in model.report.decisions if d.candidate == QDQ_INTEGER]
    assert [d.accepted for d in taken] == [True] and "bias" in taken[0].note
    reference = ReferenceEvaluator(onnx_model)
    for _ in range(2):
        xq = rng.integers(0, 256, (1, 16, k)).astype(np.uint8)
        want = reference.run(None, {"xq": xq})[0].astype(int)
        got = np.asarray(model(xq)).astype(int)
        assert 0 < np.count_nonzero((want != 0) & (want != 255))
        assert np.abs(got - want).max() <= 1 and np.mean(got == want) > 0.98


AVX2 = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell"}  # AVX2, no AVX-512
needs_avx2 = pytest.mark.skipif("avx2" not in cpu_features.isa_flags(), reason="the CPU has no AVX2")


@needs_avx2
@pytest.mark.parametrize("pairs", [True, False])
@pytest.mark.parametrize("rows, k, n", [(24, 64, 48), (13, 128, 32)])
def test_an_avx2_qdq_matmul_runs_in_integers_without_saturating(rows, k, n, pairs, monkeypatch):
    """On an AVX2 target the int8 matmul widens data and weights to int16 and sums pairs of
    products with ``vpmaddwd`` (the pairs form, the default); the byte form takes
    ``vpmaddubsw`` on the data's low 7 bits and its top bit (each in range) and
    ``vpmaddwd`` by ones.  Extreme weights and data, where the plain ``vpmaddubsw``
    saturates its int16 pair sums, give QLinearMatMul's bits in both."""
    if not pairs:
        monkeypatch.setattr(legalize_int8_matmul, "pairs_form", lambda _target: False)
    rng = np.random.default_rng(21)
    qdq, qlinear = _qdq_matmul(rng, rows, k, n)
    for init in qdq.graph.initializer:  # pairs of weights at +-127 and -128: 255 * 255 > 32767
        if init.name == "wq":
            wq = rng.choice(np.array([-128, -127, 127, 126, 3], np.int8), (k, n))
            init.CopyFrom(_const("wq", wq))
    for init in qlinear.graph.initializer:
        if init.name == "wq":
            init.CopyFrom(_const("wq", wq))
    model = aicf_tvm.compile(qdq, target=AVX2, cache=False)
    assert [d.accepted for d in model.report.decisions if d.candidate == QDQ_INTEGER] == [True]
    assert any(k.schedule == "VNNIMatmul" for k in model.kernels), [k.schedule for k in model.kernels]
    text = str(model.lowered)
    assert ("llvm.x86.avx2.pmadd.ub.sw" in text) != pairs and "llvm.x86.avx2.pmadd.wd" in text
    assert ('"int16"' in text) == pairs and "vpdpbusd" not in text and "tdpbusd" not in text
    reference = ReferenceEvaluator(qlinear)
    for high in (True, False):
        xq = rng.integers(200 if high else 0, 256, (1, rows, k)).astype(np.uint8)
        want = reference.run(None, {"xq": xq})[0]
        got = np.asarray(model(xq))
        assert 0 < np.count_nonzero((want != 0) & (want != 255))
        np.testing.assert_array_equal(got, want)


@needs_avx2
def test_an_avx2_target_keeps_qdq_convolutions_float_and_says_why():
    rng = np.random.default_rng(22)
    p = _params(rng, True, 0, 3)
    model = aicf_tvm.compile(_qdq_conv(p, 1, 1, True), target=AVX2, cache=False)
    refused = [d for d in model.report.decisions if d.candidate == QDQ_INTEGER]
    assert refused and not any(d.accepted for d in refused)
    assert "integer convolutions need AVX-512 VNNI" in refused[0].note
    xq = rng.integers(0, 256, (1, C, HW, HW)).astype(np.uint8)
    want = ReferenceEvaluator(_qdq_conv(p, 1, 1, True)).run(None, {"xq": xq})[0]  # the float graph's values
    got = np.asarray(model(xq))
    assert np.max(np.abs(got.astype(np.int32) - want.astype(np.int32))) <= 1


@pytest.mark.parametrize("mcpu, pairs", [("haswell", True), ("znver3", True), ("skylake-avx512", True),
                                         ("cascadelake", False), ("sapphirerapids", False), ("znver4", False)])
def test_the_pairs_form_is_for_avx2_without_vnni(mcpu, pairs):
    """The int16 pairs form where the target's best int8 product is AVX2's; the byte form
    (``vpdpbusd``, AMX) where it has AVX-512 VNNI."""
    assert pairs_form(resolve_target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": mcpu})) == pairs
    assert not pairs_form(None)
