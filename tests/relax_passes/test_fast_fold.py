"""``relax_passes.fast_fold``: numpy's transposes and reshapes of constants, and
``FoldConstant`` run on the compile-time part of a function, give what Relax's
``FoldConstant`` gives on the whole module."""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from relax_passes.fast_fold import fold_constant_part, fold_in_numpy

RNG = np.random.default_rng(7)
W = RNG.standard_normal((3, 4, 5)).astype("float32")
B = RNG.standard_normal((20,)).astype("float32")


def _module() -> tvm.IRModule:
    """Constants transposed, reshaped and added to; a ``zeros_like`` and a ``shape_of`` of
    a run-time value (folded from its type alone); run-time arithmetic (not folded)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 20), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = bb.emit(relax.op.permute_dims(relax.const(W), [2, 0, 1]))
            w = bb.emit(relax.op.reshape(w, (5, 12)))
            w = bb.emit(relax.op.reshape(relax.op.add(w, relax.const(np.float32(0.5))), (20, 3)))
            bias = bb.emit(relax.op.add(relax.const(B), relax.const(B)))
            zeros = bb.emit(relax.op.zeros_like(x))
            shape = bb.emit(relax.op.shape_to_tensor(relax.op.shape_of(x)))
            h = bb.emit(relax.op.add(relax.op.add(x, bias), zeros))
            y = bb.emit(relax.op.matmul(h, w))
            out = bb.emit_output(relax.Tuple([y, shape]))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod: tvm.IRModule, x: np.ndarray) -> list[np.ndarray]:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return [t.numpy() for t in vm["main"](tvm.runtime.tensor(x))]


def _calls(mod: tvm.IRModule) -> list[str]:
    return [b.value.op.name for blk in mod["main"].body.blocks for b in blk.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]


def _bound_constants(mod: tvm.IRModule) -> list[np.ndarray]:
    return [b.value.value.numpy() for blk in mod["main"].body.blocks for b in blk.bindings
            if isinstance(b.value, tvm.ir.Constant)]


def test_fold_in_numpy_is_numpys_transpose_and_reshape():
    folded = fold_in_numpy(_module())
    assert "relax.permute_dims" not in _calls(folded)
    moved = {c.shape: c for c in _bound_constants(folded)}  # the transpose, then the reshape of it
    np.testing.assert_array_equal(moved[(5, 3, 4)], W.transpose(2, 0, 1))
    np.testing.assert_array_equal(moved[(5, 12)], W.transpose(2, 0, 1).reshape(5, 12))
    bb = relax.BlockBuilder()  # a reshape of a constant
    with bb.function("main", []):
        with bb.dataflow():
            y = bb.emit_output(relax.op.reshape(relax.const(W), (4, 15)))
        bb.emit_func_output(y)
    [reshaped] = _bound_constants(fold_in_numpy(bb.get()))
    np.testing.assert_array_equal(reshaped, W.reshape(4, 15))


def test_the_partial_fold_is_relax_fold_constant():
    mod = _module()
    whole = relax.transform.DeadCodeElimination()(relax.transform.FoldConstant()(mod))
    part = relax.transform.DeadCodeElimination()(fold_constant_part(relax.transform.FoldConstant(), mod))
    assert tvm_ffi.structural_equal(part, whole)
    assert {"relax.zeros_like", "relax.shape_of", "relax.permute_dims"}.isdisjoint(_calls(part))
    x = RNG.standard_normal((2, 20)).astype("float32")
    y, shape = _run(part, x)
    np.testing.assert_allclose(y, (x + 2 * B) @ (W.transpose(2, 0, 1).reshape(5, 12) + 0.5).reshape(20, 3),
                               rtol=1e-5)
    np.testing.assert_array_equal(shape, [2, 20])


def test_a_module_without_constants_is_returned_as_it_is():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((tvm.tirx.Var("n", "int64"), 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.add(x, x))
        bb.emit_func_output(y)
    mod = bb.get()
    assert fold_constant_part(relax.transform.FoldConstant(), mod).same_as(mod)

