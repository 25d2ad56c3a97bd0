"""Bad input, one test per row of docs/bad_input.md that is not already tested elsewhere.

Each test feeds one bad thing (model file, contradicting annotation, run-time input,
database, target, CLI argument) and checks what the user sees: an exception of our own
type (or argparse's usage error) whose message names the culprit, or, where the input
is legal but unusual, the right answer.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax, tirx

import aicf_tvm
from aicf_tvm import EMIT_ATTR, AliasContradiction, Emit, emit_of
from aicf_tvm.core.contract import ContractFacts
from aicf_tvm.core.errors import (
    DeployError,
    InputError,
    TargetError,
    TuningError,
    UnsupportedModelError,
)
from aicf_tvm.core.lattice import Alias
from aicf_tvm.driver.cli import main
from relax_passes import LiftEmits

from .conftest import light_model_path, run_vm

TARGET = {"kind": "llvm", "num-cores": 2}


def _module(*shapes, op=relax.op.add) -> tvm.IRModule:
    """main(x, y...) = op over its inputs (x + x with one input)."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(op(params[0], params[-1])))
        bb.emit_func_output(out)
    return bb.get()


@pytest.fixture(scope="module")
def add4() -> aicf_tvm.CompiledModel:
    return aicf_tvm.compile(_module((4,)), target=TARGET)


def _error_line(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("aicf: error: "), err
    return err[0]


def _usage_error(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


# --- model files ------------------------------------------------------------------------------

def test_truncated_onnx_file(tmp_path):
    data = light_model_path("squeezenet").read_bytes()
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) // 2])
    with pytest.raises(UnsupportedModelError, match=r"cut\.onnx: not an ONNX model"):
        aicf_tvm.from_onnx(tmp_path / "cut.onnx")


def test_garbage_bytes_as_onnx():
    with pytest.raises(UnsupportedModelError, match="the given bytes are not an ONNX model"):
        aicf_tvm.from_onnx(b"\x00\x01garbage")


def test_onnx_graph_the_frontend_rejects_names_the_failure():
    """A node reads a value nothing defines: the frontend fails, we say so in one message."""
    node = helper.make_node("Add", ["x", "undefined_value"], ["y"], name="add0")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    with pytest.raises(UnsupportedModelError, match="the ONNX frontend failed"):
        aicf_tvm.from_onnx(helper.make_model(graph))


def test_object_that_is_not_a_model():
    with pytest.raises(UnsupportedModelError, match="cannot import a int"):
        aicf_tvm.compile(12345, target=TARGET)


def test_unknown_builtin_model_lists_the_builtins():
    with pytest.raises(UnsupportedModelError,
                       match=r"no_such_model: no such file, and not a built-in model \(.*encoder"):
        aicf_tvm.compile("no_such_model", target=TARGET)


@pytest.mark.parametrize("spec, culprit", [("nosuchpkg.mod:fn", "cannot import"),
                                           ("os.path:sep", "returned str, not a tvm.IRModule")])
def test_module_function_spec_that_fails(spec, culprit):
    with pytest.raises(UnsupportedModelError, match=re.escape(f"{spec}: {culprit}")):
        aicf_tvm.compile(spec, target=TARGET)


def test_module_without_main():
    with pytest.raises(UnsupportedModelError, match="the module has no 'main' function"):
        aicf_tvm.compile(tvm.IRModule({}), target=TARGET)


# --- annotations that contradict -----------------------------------------------------------------

def test_compile_refuses_an_alias_assertion_that_contradicts_the_facts():
    """A user-lifted module asserts out MustAlias x1 on an add; propagation proves NoAlias
    (fresh output): compile stops with both sources named, it does not pick one."""
    mod = LiftEmits()(_module((4,), (4,)))
    name = next(gv.name_hint for gv in mod.get_global_vars() if gv.name_hint.startswith("emit_add"))
    emit = emit_of(mod[name])
    must = ContractFacts.of(alias={("x1", "out"): Alias("MustAlias")})
    mod[name] = mod[name].with_attr(EMIT_ATTR, Emit(emit.kind, emit.attrs, emit.interface, emit.contract,
                                                    emit.math, emit.op, must).to_attr())
    with pytest.raises(AliasContradiction, match=r"MustAlias.*NoAlias|NoAlias.*MustAlias"):
        aicf_tvm.compile(mod, target=TARGET)


# --- inputs at run time --------------------------------------------------------------------------

def test_symbolic_dim_bound_twice_differently():
    n = tirx.Var("n", "int64")
    model = aicf_tvm.compile(_module((n, 4), (n, 4)), target=TARGET)
    with pytest.raises(InputError, match="input x1: dim n = 3, but input x0 has n = 2"):
        model(np.ones((2, 4), "float32"), np.ones((3, 4), "float32"))


def test_rank0_input_stays_rank0():
    """Found by the fuzzer: ``np.ascontiguousarray`` turns a 0-d array into shape (1,)."""
    model = aicf_tvm.compile(_module((3,), ()), target=TARGET)
    x, s = np.arange(3, dtype="float32"), np.asarray(np.float32(2.5))
    np.testing.assert_array_equal(model(x, s), x + s)


def test_non_contiguous_input_is_copied_not_misread(add4):
    model = aicf_tvm.compile(_module((2, 3)), target=TARGET)
    view = np.arange(6, dtype="float32").reshape(3, 2).T  # strides (4, 8): not row-major
    np.testing.assert_array_equal(model(view), view + view)


def test_python_list_is_float64_and_refused(add4):
    with pytest.raises(InputError, match="input x0: dtype float64, expected float32"):
        add4([1.0, 2.0, 3.0, 4.0])


def test_nan_and_inf_inputs_propagate_like_tvm(add4):
    x = np.array([np.nan, 1.0, np.inf, -np.inf], "float32")
    np.testing.assert_array_equal(add4(x), run_vm(_module((4,)), x)[0])


# --- databases -------------------------------------------------------------------------------

def test_database_dir_that_does_not_exist(tmp_path):
    with pytest.raises(TuningError, match=r"no tuning database: .*gone does not exist"):
        aicf_tvm.compile(_module((4,)), target=TARGET, database=tmp_path / "gone")


def test_database_that_is_a_file(tmp_path):
    (tmp_path / "db").write_text("x")
    with pytest.raises(TuningError, match=r"db is a file, not a directory"):
        aicf_tvm.compile(_module((4,)), target=TARGET, database=tmp_path / "db")


def test_empty_database_dir_means_default_schedules(tmp_path):
    model = aicf_tvm.compile(_module((4,)), target=TARGET, database=tmp_path)
    x = np.arange(4, dtype="float32")
    np.testing.assert_array_equal(model(x), x + x)


def test_cli_database_that_does_not_exist(capsys, tmp_path):
    line = _error_line(capsys, ["compile", "encoder_layer_small", "-o", str(tmp_path / "a.so"),
                                "--database", str(tmp_path / "gone")])
    assert "--database" in line and "no such directory" in line


# --- targets ---------------------------------------------------------------------------------

@pytest.mark.parametrize("target, culprit", [
    (42, "unknown target 42"),
    ({"kind": "llvm", "bogus": 1}, "Unknown config option 'bogus'"),
    ({"kind": "llvm", "mcpu": "notacpu"}, "LLVM does not know the CPU mcpu='notacpu'"),
])
def test_bad_target_in_python(target, culprit):
    with pytest.raises(TargetError, match=re.escape(culprit)):
        aicf_tvm.compile(_module((4,)), target=target)


def test_export_into_a_missing_directory(add4, tmp_path):
    with pytest.raises(DeployError, match=r"a\.so: directory .*gone does not exist"):
        add4.export(tmp_path / "gone" / "a.so")


# --- CLI arguments ---------------------------------------------------------------------------

def test_cli_without_a_command(capsys):
    assert "required: COMMAND" in _usage_error(capsys, [])


def test_cli_unknown_command(capsys):
    assert "invalid choice: 'frobnicate'" in _usage_error(capsys, ["frobnicate"])


def test_cli_missing_required_arguments(capsys):
    assert "required: -o/--output" in _usage_error(capsys, ["compile", "encoder_layer_small"])


@pytest.mark.parametrize("value, culprit", [("-3", "-3 is not positive"), ("lots", "'lots' is not an integer")])
def test_cli_trials_must_be_a_positive_integer(capsys, tmp_path, value, culprit):
    err = _usage_error(capsys, ["tune", "encoder_layer_small", "--trials", value, "--work-dir", str(tmp_path)])
    assert culprit in err
    assert not any(tmp_path.iterdir())  # refused before any tuning


@pytest.mark.parametrize("value, culprit", [("0", "0 is not a positive number of seconds"),
                                            ("-2", "-2 is not a positive number of seconds"),
                                            ("nan", "nan is not a positive number of seconds"),
                                            ("soon", "'soon' is not a number of seconds")])
def test_cli_runner_timeout_must_be_positive_seconds(capsys, tmp_path, value, culprit):
    argv = ["tune", "encoder_layer_small", "--runner-timeout", value, "--work-dir", str(tmp_path)]
    assert culprit in _usage_error(capsys, argv)
    assert not any(tmp_path.iterdir())  # refused before any tuning


def test_cli_input_without_equals(capsys, tmp_path):
    line = _error_line(capsys, ["run", str(tmp_path / "x.so"), "--input", "noequals"])
    assert line.endswith("--input noequals: expected NAME=FILE.npy")


def test_cli_output_into_a_missing_directory_fails_before_compiling(capsys, tmp_path):
    line = _error_line(capsys, ["compile", "encoder_layer_small", "-o", str(tmp_path / "gone" / "a.so")])
    assert line.endswith("does not exist")
    assert "compiling" not in capsys.readouterr().err


def test_onnx_model_object_is_accepted():
    """Not bad input: an in-memory ``onnx.ModelProto`` imports like a file does."""
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = aicf_tvm.compile(helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)]),
                             target=TARGET)
    np.testing.assert_array_equal(model(np.array([-1.0, 2.0], "float32")), [0.0, 2.0])
