"""``relax_passes.narrow_constants``: constant folding leaves a widening cast of a narrow
integer constant (a quantized weight) in the graph, folds everything else as before, and
the module computes the same values either way."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from aicf_tvm.driver.frontends.common import normalize_import
from relax_passes.ieee_fold import FoldConstantIEEE
from relax_passes.narrow_constants import keep_narrow
from tests.helpers import relax_constants

W = np.arange(-6, 6, dtype="int8").reshape(3, 4)


def _module(weight: np.ndarray) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = bb.emit(relax.op.astype(relax.const(weight), "float32"))
            ones = relax.const(np.ones((2, 3), "float32"))
            shift = bb.emit(relax.op.add(ones, ones))  # constants only: folded
            y = bb.emit_output(relax.op.matmul(relax.op.add(x, shift), w))
        bb.emit_func_output(y)
    return bb.get()


def _ops(mod: tvm.IRModule) -> list[str]:
    return [b.value.op.name for blk in mod["main"].body.blocks for b in blk.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]


def _run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    ex = tvm.compile(mod, target="llvm")
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def test_a_widened_int8_constant_stays_a_cast_and_the_rest_folds():
    mod = _module(W)
    for folded in (keep_narrow(relax.transform.FoldConstant(), mod), FoldConstantIEEE()(mod), normalize_import(mod)):
        ops = _ops(folded)
        assert "relax.astype" in ops  # the int8 weight is still int8, cast in the graph
        assert ops.count("relax.add") == 1  # ones + ones folded; x + shift left
        consts = relax_constants(folded)
        assert any(str(c.ty.dtype) == "int8" for c in consts)
        assert not any(str(c.ty.dtype) == "float32" and tuple(int(d) for d in c.ty.shape) == W.shape
                       for c in consts)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype("float32")
    want = (x.astype(np.float64) + 2.0) @ W.astype(np.float64)
    np.testing.assert_allclose(_run(FoldConstantIEEE()(mod), x), want, rtol=1e-6)


def test_a_float_to_float_cast_of_a_constant_is_still_folded():
    mod = _module(W.astype("float16"))
    assert "relax.astype" not in _ops(FoldConstantIEEE()(mod))


def test_a_widened_constant_that_no_matmul_reads_is_folded():
    """A uint8 table made float for an add (a mask) is not a weight: folded as before."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            mask = bb.emit(relax.op.astype(relax.const(np.eye(3, 4, dtype="uint8")), "float32"))
            y = bb.emit_output(relax.op.add(x, mask))
        bb.emit_func_output(y)
    assert "relax.astype" not in _ops(FoldConstantIEEE()(bb.get()))
