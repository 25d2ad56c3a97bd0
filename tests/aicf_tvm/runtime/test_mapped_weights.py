"""A library's weights after its code, mapped at load (``aicf_tvm/runtime/mapped_weights.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import aicf_tvm
from aicf_tvm import DeployError
from aicf_tvm.runtime import deploy, mapped_weights

from ...helpers import assert_input_sensitive

onnx = pytest.importorskip("onnx")
helper = onnx.helper


def _mlp(w1: np.ndarray, w2: np.ndarray, b: np.ndarray) -> onnx.ModelProto:
    """``relu(x @ w1 + b) @ w2``: two weights above ``MIN_BYTES``, a bias below it."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    inits = [onnx.numpy_helper.from_array(v, k) for k, v in (("w1", w1), ("w2", w2), ("b", b))]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def weights() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    return (rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal((96, 48)).astype(np.float32),
            rng.standard_normal(96).astype(np.float32))


@pytest.fixture(scope="module")
def compiled(weights):
    return aicf_tvm.compile(aicf_tvm.from_onnx(_mlp(*weights)), cache=False)


@pytest.fixture(scope="module")
def library(compiled, tmp_path_factory) -> Path:
    return compiled.export(tmp_path_factory.mktemp("mapped") / "mlp.so")


def _reference(x: np.ndarray, w1: np.ndarray, w2: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.maximum(x.astype(np.float64) @ w1 + b, 0) @ w2


def _mappings_of(path: Path) -> list[tuple[int, int, str]]:
    """(start, end, permissions) of this process's mappings of the file at ``path``."""
    st = os.stat(path)
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    out = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(None, 5)
            if len(fields) > 4 and fields[4] == str(st.st_ino) and fields[3] == device:
                start, end = (int(v, 16) for v in fields[0].split("-"))
                out.append((start, end, fields[1]))
    return out


def test_the_weights_follow_the_code_once_and_load_mapped_from_the_file(compiled, library, weights):
    meta = deploy.read_metadata(library)
    info = meta["weights"]
    assert sum(t["nbytes"] for t in info["tensors"]) >= weights[0].nbytes + weights[1].nbytes  # (maybe prepacked)
    assert all(t["nbytes"] >= 4096 for t in info["tensors"])  # the bias stays in the executable
    assert f"weights: {len(info['tensors'])} tensors" in deploy.manifest(meta, library.name)  # aicf explain
    data = library.read_bytes()
    start = len(data) - info["size"]
    assert start % mapped_weights.PAGE == 0  # the region: the file's end, from a page boundary
    for t in info["tensors"]:  # each weight's bytes once in the file: not also inside the executable
        assert data.count(data[start + t["offset"]:start + t["offset"] + t["nbytes"]]) == 1
    loaded = aicf_tvm.load(library)
    maps = _mappings_of(library)
    for tensor in loaded.weights:
        at = np.from_dlpack(tensor).ctypes.data
        assert any(start <= at < end and perms.startswith("rw") and perms.endswith("p")
                   for start, end, perms in maps), "a weight that is not in a private mapping of the library"
    rng = np.random.default_rng(12)
    xs = [rng.standard_normal((4, 64)).astype(np.float32) for _ in range(2)]
    outs = [np.asarray(loaded(x)) for x in xs]
    assert_input_sensitive(outs[0], outs[1], rtol=0, atol=0, what="the loaded model")
    for x, out in zip(xs, outs):
        np.testing.assert_array_equal(out, np.asarray(compiled(x)))
        np.testing.assert_allclose(out, _reference(x, *weights), rtol=1e-4, atol=1e-4)


def test_a_model_runs_from_two_loads_of_one_library(library, weights):
    first, second = aicf_tvm.load(library), aicf_tvm.load(library)
    x = np.random.default_rng(13).standard_normal((4, 64)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(first(x)), np.asarray(second(x)))
    assert second.benchmark(x, number=2, repeat=1) > 0


@pytest.mark.parametrize("damage", ["flip_weight", "cut_weights", "extend"])
def test_a_damaged_weight_region_is_named(library, tmp_path, damage):
    data = bytearray(library.read_bytes())
    info = deploy.read_metadata(library)["weights"]
    start = len(data) - info["size"]
    if damage == "flip_weight":
        last = info["tensors"][-1]
        data[start + last["offset"] + last["nbytes"] // 2] ^= 0x01
        said = r"corrupt file \(weight \d+ of \d+"
    elif damage == "cut_weights":
        data = data[:start + info["size"] // 2]
        said = r"corrupt file \(truncated: "
    else:
        data += b"\0" * 8
        said = r"corrupt file \(its \d+ bytes of weights do not start on a page"
    path = tmp_path / "damaged.so"
    path.write_bytes(bytes(data))
    with pytest.raises(DeployError, match=r"damaged\.so: " + said):
        aicf_tvm.load(path)
    with pytest.raises(DeployError, match=r"damaged\.so: " + said):
        deploy.verify_digest(path)


def test_a_library_with_its_weights_inside_still_loads(weights, tmp_path):
    """Without the executable's twin (a library of format 1's layout) the weights stay in
    the executable, and the library runs as before."""
    model = aicf_tvm.compile(aicf_tvm.from_onnx(_mlp(*weights)), cache=False)
    path = deploy.export(model, tmp_path / "inside.so", mapped=False)
    assert "weights" not in deploy.read_metadata(path)
    loaded = aicf_tvm.load(path)
    assert loaded.weights is None
    x = np.random.default_rng(14).standard_normal((4, 64)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(loaded(x)), _reference(x, *weights), rtol=1e-4, atol=1e-4)
