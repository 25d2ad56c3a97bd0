"""The check kernels in front of gathers (``relax_passes/index_checks.py``) and their host
form for GPU targets (``HostIndexChecks``). References: numpy's indexing, which counts
``[-n, 0)`` from the end and raises ``IndexError`` on any other index."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

import aicf_tvm
from aicf_tvm import InputError
from aicf_tvm.driver.pipeline import build, run_pipeline
from relax_passes.index_checks import CHECK_ATTR, HostIndexChecks, emit_checked, holds_range

from ..conftest import llvm_target, run_vm


def _checked_module(dtype: str, shape: tuple, extents: list, from_end: bool,
                    out_dtype: str = "int64") -> tvm.IRModule:
    i = relax.Var("i", relax.TensorType(shape, dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [i]):
        with bb.dataflow():
            out = emit_checked(bb, i, extents, out_dtype, from_end, "input i", "a test")
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()


def test_in_range_indices_come_back_counted_from_the_end():
    indices = np.array([[0, -1, 6], [-7, 3, 2]], "int32")
    got = run_vm(_checked_module("int32", (2, 3), [7], True), indices)[0]
    np.testing.assert_array_equal(got, np.arange(7)[indices])
    assert got.dtype == np.int64


@pytest.mark.parametrize("from_end, bad, low",
                         [(True, -8, -7), (True, 7, -7), (False, -1, 0), (False, 2**40, 0)])
def test_an_index_out_of_range_raises_naming_index_position_and_bound(from_end, bad, low):
    indices = np.array([[0, 1, 2], [3, bad, 4]])
    with pytest.raises(InputError, match=rf"input i: index {bad} at \[1, 1\] is out of range "
                                         rf"\[{low}, 7\) of a test"):
        run_vm(_checked_module("int64", (2, 3), [7], from_end), indices)


def test_each_coordinate_is_checked_against_its_own_axis():
    """gather_nd: the last axis holds one coordinate per data axis (extents 4 and 2)."""
    module = _checked_module("int64", (2, 2), [4, 2], True)
    np.testing.assert_array_equal(run_vm(module, np.array([[3, -2], [-4, 1]]))[0], [[3, 0], [0, 1]])
    with pytest.raises(InputError, match=r"index 2 at \[1, 1\] is out of range \[-2, 2\)"):
        run_vm(module, np.array([[3, 1], [0, 2]]))


def test_unsigned_and_scalar_indices():
    small = _checked_module("uint8", (3,), [200], True)
    np.testing.assert_array_equal(run_vm(small, np.array([0, 199, 7], "uint8"))[0], [0, 199, 7])
    with pytest.raises(InputError, match=r"index 250 at \[1\] is out of range \[0, 200\)"):
        run_vm(small, np.array([0, 250, 7], "uint8"))
    wide = _checked_module("uint8", (2,), [300], True)  # 300 does not fit uint8: compared wide
    np.testing.assert_array_equal(run_vm(wide, np.array([255, 44], "uint8"))[0], [255, 44])
    with pytest.raises(InputError, match=r"index 18446744073709551615 at \[0\] is out of range "
                                         r"\[0, 5\)"):
        run_vm(_checked_module("uint64", (2,), [5], True), np.array([2**64 - 1, 1], "uint64"))
    with pytest.raises(InputError, match=r"index 9 is out of range \[-5, 5\)"):
        run_vm(_checked_module("int64", (), [5], True), np.array(9))


def _embedding(bad: bool):
    x = relax.Var("x", relax.TensorType((10, 4), "float32"))
    i = relax.Var("i", relax.TensorType((3,), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, i]):
        with bb.dataflow():
            rows = relax.op.take(x, i, axis=0)
            out = bb.emit_output(relax.op.multiply(rows, relax.const(2.0, "float32")))
        bb.emit_func_output(out)
    return bb.get()


def test_compiled_take_keeps_its_check_and_the_host_form_checks_alike():
    """Through the whole pipeline (LiftEmits leaves the check's call_tir alone), and with
    ``HostIndexChecks`` (the CUDA form, here on the CPU): same rows, same error."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((10, 4)).astype("float32")
    target = llvm_target()
    stages = run_pipeline(_embedding(False), target, until="schedule")
    on_host = HostIndexChecks()(stages.lowered)
    assert not [f for f in on_host.functions.values()
                if isinstance(f, tirx.PrimFunc) and CHECK_ATTR in (f.attrs or {})]
    for executable in (build(stages.lowered, target), build(on_host, target)):
        vm = relax.VirtualMachine(executable, tvm.cpu())
        got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(np.array([3, -1, 0]))).numpy()
        np.testing.assert_array_equal(got, x[[3, -1, 0]] * 2)
        with pytest.raises(InputError, match=r"input i: index 10 at \[2\] is out of range "
                                             r"\[-10, 10\)"):
            vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(np.array([3, 1, 10])))


def test_an_exported_library_loaded_in_a_fresh_process_still_checks(tmp_path):
    import subprocess
    import sys

    compiled = aicf_tvm.compile(_embedding(False))
    path = compiled.export(tmp_path / "take.so")
    probe = (f"import numpy as np, aicf_tvm\nm = aicf_tvm.load({str(path)!r})\n"
             "x = np.ones((10, 4), np.float32)\nprint(m(x, np.array([9, 0, -10]))[0, 0])\n"
             "try:\n    m(x, np.array([1, 12, 0]))\n"
             "except aicf_tvm.InputError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "2.0"
    assert "input i: index 12 at [1] is out of range [-10, 10)" in out.stdout


def test_holds_range_only_for_dtypes_that_hold_every_index():
    assert holds_range("int32", [100]) and holds_range("int64", [tirx.Var("n", "int64")])
    assert not holds_range("int8", [200]) and not holds_range("int32", [tirx.Var("n", "int64")])
    assert not holds_range("uint32", [4]) and not holds_range("float32", [4])


def test_indices_that_folding_makes_constant_are_checked_at_compile_time():
    """BERT's embeddings: position and token-type ids sliced from constant buffers become
    constants only after normalize's later folds; their check kernel then had a constant
    operand, which FuseTIR refuses ("Tensor constants are not supported in primitive
    functions"): BERT, GPT-2 and LLaMA did not compile."""
    torch = pytest.importorskip("torch")

    class PositionEmbedding(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(512, 8)
            self.typ = torch.nn.Embedding(2, 8)
            self.register_buffer("pos", torch.arange(512).expand((1, -1)), persistent=False)
            self.register_buffer("types", torch.zeros((1, 512), dtype=torch.long), persistent=False)

        def forward(self, x):
            seq = x.shape[1]
            types = torch.gather(self.types[:, :seq].expand(x.shape[0], seq), 1, self.pos[:, :seq])
            return self.emb(self.pos[:, :seq]) + self.typ(types) + x

    torch.manual_seed(0)
    module = PositionEmbedding().eval()
    x = torch.randn(1, 128, 8)
    model = aicf_tvm.compile(aicf_tvm.from_torch(module, (x,)))
    assert not any(k.kind == "opaque" for k in model.kernels)  # no check kernel is left
    np.testing.assert_array_equal(model(x.numpy()), module(x).detach().numpy())
