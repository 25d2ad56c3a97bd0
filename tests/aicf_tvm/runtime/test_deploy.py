"""export/load: the library carries its metadata; anything else is a DeployError naming the file."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax

import aicf_tvm
from aicf_tvm import DeployError, InputError
from aicf_tvm.core.emit import Emit
from aicf_tvm.driver.models import BUILTIN_MODELS
from aicf_tvm.runtime import cpu_features, deploy
from aicf_tvm.runtime.compiled import flat_outputs

from ...helpers import assert_input_sensitive, relax_main


@pytest.fixture(scope="module")
def compiled():
    return aicf_tvm.compile(BUILTIN_MODELS["encoder_layer_small"]())


@pytest.fixture(scope="module")
def exported(compiled, tmp_path_factory) -> Path:
    return compiled.export(tmp_path_factory.mktemp("deploy") / "small.so")


@pytest.fixture
def x() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((1, 16, 64)).astype(np.float32)


def test_round_trip_runs_like_the_in_memory_model(compiled, exported, x):
    loaded = aicf_tvm.load(exported)
    other = np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
    assert_input_sensitive(compiled(x), compiled(other), rtol=0, atol=0, what="the compiled model")
    for a in (x, other):
        np.testing.assert_array_equal(loaded(a), compiled(a))
        np.testing.assert_array_equal(loaded(x=a), compiled(a))


def test_loaded_model_keeps_specs_kernels_report_and_emits(compiled, exported):
    loaded = aicf_tvm.load(exported)
    assert loaded.inputs == compiled.inputs and loaded.outputs == compiled.outputs
    assert loaded.kernels == compiled.kernels
    assert str(loaded.report) == str(compiled.report)
    assert loaded.target.export()["mcpu"] == compiled.target.export()["mcpu"]
    meta = loaded.metadata
    assert meta["magic"] == "aicf-tvm" and meta["format_version"] == deploy.FORMAT_VERSION
    kinds = {Emit.from_attr(e["emit"]).kind for e in meta["emits"]}
    assert "fused_attention" in kinds
    assert loaded.path == str(exported) and loaded.optimized is None


def test_metadata_is_inside_the_library_not_beside_it(exported, tmp_path):
    moved = tmp_path / "moved.so"
    moved.write_bytes(exported.read_bytes())
    assert list(tmp_path.iterdir()) == [moved]
    assert aicf_tvm.load(moved).inputs[0].name == "x"


@pytest.mark.parametrize("call, culprit", [
    (lambda m, x: m(y=x), "no input named 'y'; the inputs are: x"),
    (lambda m, x: m(x.astype(np.float64)), "input x: dtype float64, expected float32"),
    (lambda m, x: m(x[:, :8]), "input x: shape [1, 8, 64], expected [1, 16, 64]"),
    (lambda m, x: m(), "missing input x"),
    (lambda m, x: m(x, x), "expected 1 inputs (x), got 2"),
    (lambda m, x: m(x, x=x), "input 'x' given twice"),
])
@pytest.mark.parametrize("which", ["in_memory", "loaded"])
def test_wrong_inputs_are_input_errors(compiled, exported, x, call, culprit, which):
    model = compiled if which == "in_memory" else aicf_tvm.load(exported)
    with pytest.raises(InputError, match=re.escape(culprit)):
        call(model, x)


def test_module_for_another_target_is_refused(tmp_path):
    if tvm.cuda(0).exist:
        pytest.skip("this host has a CUDA device")
    cuda = aicf_tvm.compile(BUILTIN_MODELS["encoder_layer_small"](), target="cuda")
    path = cuda.export(tmp_path / "cuda.so")
    with pytest.raises(DeployError, match=r"cuda\.so: compiled for cuda .* no CUDA device"):
        aicf_tvm.load(path)


def test_module_for_another_cpu_is_refused_by_its_features(exported, monkeypatch):
    """Another CPU name with every feature the library needs loads; a missing one refuses
    (tests/aicf_tvm/driver/test_cpu_features.py has the rest)."""
    host = deploy._host_target()
    monkeypatch.setattr(deploy, "_host_target", lambda: {**host, "mcpu": "some-other-cpu"})
    aicf_tvm.load(exported)
    needed = deploy.read_metadata(exported)["isa_features"]
    if not needed:
        pytest.skip("the library needs no instruction-set extension")
    flag = cpu_features.LLVM_TO_CPUINFO[needed[-1]]
    flags = cpu_features.isa_flags()
    monkeypatch.setattr(cpu_features, "isa_flags", lambda: flags - {flag})
    with pytest.raises(DeployError, match=rf"small\.so: compiled for CPU .* instructions .*{needed[-1]}"):
        aicf_tvm.load(exported)


def test_device_of_the_wrong_kind_is_refused(exported):
    with pytest.raises(DeployError, match=r"small\.so: compiled for llvm, cannot run on device cuda"):
        aicf_tvm.load(exported, device="cuda")


def test_plain_tvm_library_is_not_ours(tmp_path):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.add(x, x)))
        bb.emit_func_output(out)
    path = tmp_path / "plain.so"
    tvm.compile(bb.get(), target=tvm.target.Target({"kind": "llvm"})).export_library(str(path))
    with pytest.raises(DeployError, match=r"plain\.so: not an AICF module"):
        aicf_tvm.load(path)


def test_random_bytes_are_not_a_library(tmp_path):
    path = tmp_path / "random.so"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(DeployError, match=r"random\.so: not a shared library"):
        aicf_tvm.load(path)


@pytest.mark.parametrize("damage", ["truncate", "cut_to_1000", "flip_byte", "flip_metadata"])
def test_corrupt_library_is_caught_before_loading(exported, tmp_path, damage):
    data = bytearray(exported.read_bytes())
    if damage == "truncate":
        data = data[: len(data) * 3 // 4]
    elif damage == "cut_to_1000":
        data = data[:1000]
    elif damage == "flip_byte":
        data[-64] ^= 0xFF
    else:
        at = data.find(deploy.MAGIC) + deploy._HEADER_LEN + 10
        data[at] ^= 0xFF
    path = tmp_path / "damaged.so"
    path.write_bytes(bytes(data))
    said = r"corrupt file \(truncated: " if damage in ("truncate", "cut_to_1000") else r"corrupt"
    with pytest.raises(DeployError, match=r"damaged\.so: " + said):
        aicf_tvm.load(path)


def test_a_library_exported_again_to_the_same_path_loads_as_the_new_one(tmp_path):
    """Another model exported over a library this process loaded: ``load`` runs the new
    file's code (``dlopen`` alone would hand back the library it loaded under that name),
    and the old model keeps running its own."""
    from onnx import TensorProto, helper, numpy_helper

    def relu_of_matmul(w: np.ndarray) -> aicf_tvm.CompiledModel:
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w")])
        return aicf_tvm.compile(aicf_tvm.from_onnx(helper.make_model(graph, opset_imports=[
            helper.make_opsetid("", 17)])), cache=False)

    rng = np.random.default_rng(5)
    w1, w2 = (rng.standard_normal((8, 6)).astype(np.float32) for _ in range(2))
    x = rng.standard_normal((4, 8)).astype(np.float32)
    path = tmp_path / "m.so"
    relu_of_matmul(w1).export(path)
    first = aicf_tvm.load(path)
    relu_of_matmul(w2).export(path)
    second = aicf_tvm.load(path)
    np.testing.assert_allclose(np.asarray(second(x)), np.maximum(x.astype(np.float64) @ w2, 0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(first(x)), np.maximum(x.astype(np.float64) @ w1, 0), rtol=1e-5, atol=1e-5)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the load's own names are gone


def test_missing_file(tmp_path):
    with pytest.raises(DeployError, match=r"gone\.so: no such file"):
        aicf_tvm.load(tmp_path / "gone.so")


def _in_memory_and_loaded(mod, tmp_path):
    compiled = aicf_tvm.compile(mod)
    return [compiled, aicf_tvm.load(compiled.export(tmp_path / "model.so"))]


def _aligned_empty(shape: tuple, align: int = 64) -> np.ndarray:
    """A zero-size float32 array at a 64-byte aligned address with the strides numpy gives
    ``np.zeros((0, 4))`` (all 0): zero-copy would pass those strides to the kernel."""
    base = np.empty(align * 2, np.uint8)
    start = -base.ctypes.data % align
    aligned = base[start:start + 4].view(np.float32)
    return np.lib.stride_tricks.as_strided(aligned, shape, (0,) * len(shape))


def test_zero_size_input_gives_zero_size_output(tmp_path):
    n = tvm.tirx.Var("n", "int64")
    bias = np.random.default_rng(3).standard_normal(4).astype(np.float32)
    mod = relax_main([relax.Var("x", relax.TensorType((n, 4), "float32"))],
                       lambda bb, x: relax.op.nn.relu(relax.op.add(x, relax.const(bias))))
    x = _aligned_empty((0, 4))
    assert x.ctypes.data % 64 == 0 and x.flags.c_contiguous and x.size == 0
    for model in _in_memory_and_loaded(mod, tmp_path):
        out = model(x)
        assert out.shape == (0, 4) and out.dtype == np.float32
        v = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32)
        np.testing.assert_allclose(model(v), np.maximum(v + bias, 0), rtol=1e-6)


def test_nested_tuple_output_comes_back_nested_and_named_in_order(tmp_path):
    """main returns ((exp(x), relu(x)), sum(x, axis=1)): lists nested the same way, and
    ``flat_outputs`` lines them up with the output specs (output.0.0, output.0.1, output.1)."""
    mod = relax_main([relax.Var("x", relax.TensorType((4, 8), "float32"))], lambda bb, x: relax.Tuple([
        relax.Tuple([bb.emit(relax.op.exp(x)), bb.emit(relax.op.nn.relu(x))]), bb.emit(relax.op.sum(x, axis=1))]))
    x = np.random.default_rng(5).standard_normal((4, 8)).astype(np.float32)
    want = [np.exp(x), np.maximum(x, 0), x.sum(axis=1)]
    for model in _in_memory_and_loaded(mod, tmp_path):
        (a, b), c = model(x)
        for got, ref in zip((a, b, c), want):
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
        assert [s.name for s in model.outputs] == ["output.0.0", "output.0.1", "output.1"]
        flat = flat_outputs(model(x))
        assert [(list(s.shape), s.dtype) for s in model.outputs] == [(list(f.shape), str(f.dtype)) for f in flat]
