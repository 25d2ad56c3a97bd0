"""The `aicf` command: help, demo, compile -> run end to end, and one-line errors for bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from aicf_tvm.driver.cli import COMMANDS, main

from ...helpers import assert_input_sensitive, light_model, ort_function


def _aicf(*argv: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """`aicf` in a fresh process, as a user runs it (without the tests' AICF_DEBUG checks)."""
    env = {k: v for k, v in os.environ.items() if k != "AICF_DEBUG"}
    return subprocess.run([sys.executable, "-m", "aicf_tvm.driver.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)


def _error_line(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    """Run ``aicf argv`` in process; assert it failed with exactly one error line, return it."""
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("aicf: error: "), err
    return err[0]


def unsupported_op_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu0"),
             helper.make_node("FancyOp", ["y"], ["z"], name="mystery_node")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])])
    return helper.make_model(graph)


@pytest.fixture(scope="module")
def small_so(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "small.so"
    assert main(["compile", "encoder_layer_small", "-o", str(out)]) == 0
    return out


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_on_each_command_exits_zero(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert f"usage: aicf {command}" in capsys.readouterr().out


def test_compile_then_run_in_a_fresh_process_matches_onnxruntime(tmp_path):
    pytest.importorskip("onnxruntime")
    model_path = tmp_path / "squeezenet.onnx"
    onnx.save(light_model("squeezenet"), model_path)
    lib = tmp_path / "squeezenet.so"
    res = _aicf("compile", str(model_path), "-o", str(lib))
    assert res.returncode == 0, res.stderr
    assert f"wrote {lib}" in res.stdout and "fused_conv2d_bias_act" in res.stdout

    x, other = (np.random.default_rng(seed).standard_normal((1, 3, 224, 224)).astype(np.float32) for seed in (1, 2))
    np.save(tmp_path / "x.npy", x)
    res = _aicf("run", str(lib), "--input", f"data_0={tmp_path / 'x.npy'}", "--output", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("output: float32[1, 1000, 1, 1]")

    reference = ort_function(str(model_path))
    want = reference(x)
    assert_input_sensitive(want, reference(other), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.load(tmp_path / "out" / "output.npy"), want, rtol=1e-4, atol=1e-5)


def test_demo_checks_against_tvm_and_prints_latencies(capsys):
    assert main(["demo", "--model", "encoder_layer_small", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "outputs match TVM's default build" in out
    assert "fusion: " in out and "fused_attention" in out and "kernels (" in out
    assert "AICF" in out and "TVM default" in out and "speed-up" in out


def test_explain_prints_emit_table_and_fusion_decisions(capsys):
    assert main(["explain", "encoder_layer_small"]) == 0
    out = capsys.readouterr().out
    assert "opaque Emits: 0" in out
    assert "fusion: " in out and "fused   fused_attention" in out


def test_run_prints_outputs_and_writes_npy(small_so, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.ones((1, 16, 64), np.float32))
    assert main(["run", str(small_so), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("output: float32[1, 16, 64] -> ")
    assert np.load(tmp_path / "output.npy").shape == (1, 16, 64)


def test_run_writes_each_output_of_a_nested_tuple_under_its_name(tmp_path, capsys):
    """main returns ((exp(x), relu(x)), sum(x)): one file per output spec, in spec order."""
    from tvm import relax

    import aicf_tvm

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            pair = relax.Tuple([bb.emit(relax.op.exp(x)), bb.emit(relax.op.nn.relu(x))])
            out = bb.emit_output(relax.Tuple([pair, bb.emit(relax.op.sum(x, axis=1))]))
        bb.emit_func_output(out)
    lib = aicf_tvm.compile(bb.get()).export(tmp_path / "nested.so")
    xv = np.random.default_rng(6).standard_normal((4, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", xv)
    assert main(["run", str(lib), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(tmp_path / "out")]) == 0
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()] == [
        "output.0.0", "output.0.1", "output.1"]
    for name, want in (("output.0.0", np.exp(xv)), ("output.0.1", np.maximum(xv, 0)), ("output.1", xv.sum(1))):
        np.testing.assert_allclose(np.load(tmp_path / "out" / f"{name}.npy"), want, rtol=1e-5, atol=1e-6)


def _static_linear_onnx() -> onnx.ModelProto:
    """y = relu(x @ w) with x declared [4, 8]: a model exported with a fixed shape."""
    from onnx import numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(12).standard_normal((8, 6)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_compile_with_a_symbolic_dim_runs_every_size_in_its_bounds(tmp_path, capsys):
    """``--shape x=rows,?`` makes the fixed first dim symbolic (the second kept), ``--dim``
    bounds it: one library runs any row count in the bounds (numpy's values) and refuses
    one outside them."""
    model_path = tmp_path / "linear.onnx"
    onnx.save(_static_linear_onnx(), model_path)
    lib = tmp_path / "linear.so"
    assert main(["compile", str(model_path), "-o", str(lib), "--shape", "x=rows,?", "--dim", "rows=1:64"]) == 0
    assert "inputs   x: float32['rows', 8]" in capsys.readouterr().out
    w = onnx.numpy_helper.to_array(_static_linear_onnx().graph.initializer[0])
    rng = np.random.default_rng(13)
    for rows in (1, 5, 64):
        x = rng.standard_normal((rows, 8)).astype(np.float32)
        np.save(tmp_path / "x.npy", x)
        assert main(["run", str(lib), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(tmp_path / "out")]) == 0
        capsys.readouterr()
        np.testing.assert_allclose(np.load(tmp_path / "out" / "output.npy"), np.maximum(x @ w, 0), rtol=1e-5,
                                   atol=1e-5)
    np.save(tmp_path / "x.npy", np.zeros((65, 8), np.float32))
    line = _error_line(capsys, ["run", str(lib), "--input", f"x={tmp_path / 'x.npy'}"])
    assert "input x: dim rows = 65 is outside its bounds [1, 64]" in line


@pytest.mark.parametrize(("flag", "culprit"), [
    (["--shape", "x=rows;8"], "dim 'rows;8' is neither a size, a name nor ?"),
    (["--dim", "rows=64"], "expected DIM=LOW:HIGH"),
])
def test_malformed_shape_or_dim_flag_is_a_usage_error(tmp_path, capsys, flag, culprit):
    with pytest.raises(SystemExit) as exit_:
        main(["compile", "encoder_layer_small", "-o", str(tmp_path / "a.so"), *flag])
    assert exit_.value.code == 2 and culprit in capsys.readouterr().err


def test_dim_of_a_model_without_it_names_the_dims_there_are(tmp_path, capsys):
    onnx.save(_static_linear_onnx(), tmp_path / "linear.onnx")
    line = _error_line(capsys, ["compile", str(tmp_path / "linear.onnx"), "-o", str(tmp_path / "a.so"),
                                "--shape", "x=rows,8", "--dim", "seq=1:64"])
    assert "dim seq: not a symbolic dim of the model (its symbolic dims are: rows)" in line
    line = _error_line(capsys, ["compile", "encoder_layer_small", "-o", str(tmp_path / "a.so"), "--shape", "x=1,16"])
    assert "input shapes can be set for ONNX models only" in line


# --- bad input: one line naming the culprit, exit code 1 ---------------------------------------

def test_missing_model_file(capsys, tmp_path):
    line = _error_line(capsys, ["compile", str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "a.so")])
    assert line.endswith("nope.onnx: no such file")


def test_file_that_is_not_onnx(capsys, tmp_path):
    (tmp_path / "junk.onnx").write_text("not a model")
    line = _error_line(capsys, ["compile", str(tmp_path / "junk.onnx"), "-o", str(tmp_path / "a.so")])
    assert "junk.onnx: not an ONNX model" in line


def test_onnx_operator_the_frontend_lacks_names_op_and_node(capsys, tmp_path):
    onnx.save(unsupported_op_model(), tmp_path / "fancy.onnx")
    line = _error_line(capsys, ["compile", str(tmp_path / "fancy.onnx"), "-o", str(tmp_path / "a.so")])
    assert "operator FancyOp (node mystery_node) is not supported" in line


@pytest.mark.parametrize("target, culprit", [("fpga", "unknown target 'fpga'"),
                                             ('{"kind": "nosuch"}', "nosuch"),
                                             ("{oops", "not valid JSON")])
def test_unknown_target(capsys, tmp_path, target, culprit):
    line = _error_line(capsys, ["compile", "encoder_layer_small", "-o", str(tmp_path / "a.so"), "--target", target])
    assert culprit in line
    assert not (tmp_path / "a.so").exists()


@pytest.mark.parametrize("array, culprit", [
    (np.ones((1, 16, 64), np.float64), "input x: dtype float64, expected float32"),
    (np.ones((1, 8, 64), np.float32), "input x: shape [1, 8, 64], expected [1, 16, 64]"),
])
def test_run_with_wrong_shape_or_dtype(small_so, tmp_path, capsys, array, culprit):
    np.save(tmp_path / "x.npy", array)
    line = _error_line(capsys, ["run", str(small_so), "--input", f"x={tmp_path / 'x.npy'}"])
    assert line.endswith(culprit)


def test_run_with_wrong_input_name(small_so, tmp_path, capsys):
    np.save(tmp_path / "y.npy", np.ones((1, 16, 64), np.float32))
    line = _error_line(capsys, ["run", str(small_so), "--input", f"y={tmp_path / 'y.npy'}"])
    assert line.endswith("no input named 'y'; the inputs are: x")


def test_run_with_missing_or_bad_npy(small_so, tmp_path, capsys):
    line = _error_line(capsys, ["run", str(small_so), "--input", f"x={tmp_path / 'gone.npy'}"])
    assert "--input x:" in line and "gone.npy: no such file" in line
    (tmp_path / "text.npy").write_text("hello")
    line = _error_line(capsys, ["run", str(small_so), "--input", f"x={tmp_path / 'text.npy'}"])
    assert "text.npy: not a .npy file" in line


def test_run_on_corrupt_or_foreign_library(small_so, tmp_path, capsys):
    corrupt = tmp_path / "corrupt.so"
    data = bytearray(small_so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    assert "corrupt.so: corrupt file" in _error_line(capsys, ["run", str(corrupt)])
    foreign = tmp_path / "foreign.so"
    foreign.write_bytes(b"\x7fELF" + bytes(1000))
    assert "foreign.so: not an AICF module" in _error_line(capsys, ["run", str(foreign)])
    assert "gone.so: no such file" in _error_line(capsys, ["run", str(tmp_path / "gone.so")])


def test_debug_shows_the_traceback(capsys, tmp_path):
    assert main(["compile", str(tmp_path / "nope.onnx"), "-o", "a.so", "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "UnsupportedModelError" in err


def test_compile_timings_prints_every_phase_once(tmp_path, capsys):
    """``--timings``: import, the pipeline's phases and the export, in order, each a
    non-negative number of seconds, and a total equal to their sum."""
    model_path = tmp_path / "linear.onnx"
    onnx.save(_static_linear_onnx(), model_path)
    assert main(["compile", str(model_path), "-o", str(tmp_path / "linear.so"), "--timings"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("compile phases:"):].splitlines()[1:]
    rows = {line.split()[0]: float(line.split()[1]) for line in table if line.startswith("  ")}
    names = [n for n in rows if n != "total"]
    assert names == ["import", "normalize", "fuse", "lower", "schedule", "codegen", "export"]
    assert all(rows[n] >= 0 for n in names)
    # each printed number is rounded to 0.01 s: the sum of the rounded phases may miss the
    # rounded total by half a hundredth per number (it did by 0.02 with seven phases)
    assert abs(sum(rows[n] for n in names) - rows["total"]) <= 0.005 * (len(names) + 1) + 1e-9
