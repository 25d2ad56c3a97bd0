"""Weights lifted to a parameter of the entry functions (``aicf_tvm/driver/weights_apart.py``)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from aicf_tvm.driver.weights_apart import MIN_BYTES, PARAM, lift_weights


def _constants(func: relax.Function) -> list[np.ndarray]:
    out: list = []
    relax.analysis.post_order_visit(
        func, lambda e: out.append(e.value.numpy()) if isinstance(e, tvm.ir.expr.GenericConst) else None)
    return out


def _module(private_weight: bool = False) -> tuple[tvm.IRModule, np.ndarray, np.ndarray]:
    """``main(x) = (x @ w) + b`` (``w`` a weight, ``b`` below ``MIN_BYTES``), and a second
    entry ``twice`` reading ``w`` too; with ``private_weight`` the matmul is in a private
    function that ``main`` calls."""
    rng = np.random.default_rng(21)
    w = rng.standard_normal((32, MIN_BYTES // 4 // 32 + 8)).astype(np.float32)
    b = rng.standard_normal(w.shape[1]).astype(np.float32)
    bb, weight = relax.BlockBuilder(), relax.const(w)  # one tensor, read by both entries
    x = relax.Var("x", relax.TensorType((4, 32), "float32"))
    helper = None
    if private_weight:
        hx = relax.Var("hx", relax.TensorType((4, 32), "float32"))
        with bb.function("helper", [hx], private=True):
            helper = bb.emit_func_output(bb.emit(relax.op.matmul(hx, weight)))
    with bb.function("main", [x]):
        m = bb.emit(relax.Call(helper, [x]) if helper is not None else relax.op.matmul(x, weight))
        bb.emit_func_output(bb.emit(relax.op.add(m, relax.const(b))))
    if not private_weight:
        x2 = relax.Var("x", relax.TensorType((4, 32), "float32"))
        with bb.function("twice", [x2]):
            m = bb.emit(relax.op.matmul(x2, weight))
            bb.emit_func_output(bb.emit(relax.op.add(m, m)))
    return bb.get(), w, b


def test_every_entry_takes_the_weights_last_and_small_constants_stay():
    mod, w, b = _module()
    lifted, weights = lift_weights(mod)
    assert len(weights) == 1 and np.array_equal(weights[0].numpy(), w)  # one weight, shared by both entries
    for name in ("main", "twice"):
        func = lifted[name]
        assert func.params[-1].name == PARAM and len(func.params) == len(mod[name].params) + 1
        assert not any(c.nbytes >= MIN_BYTES for c in _constants(func))
    assert [c.shape for c in _constants(lifted["main"])] == [b.shape]
    assert lift_weights(lifted) is None  # nothing left to lift


def test_the_lifted_module_computes_the_same_bits():
    mod, w, b = _module()
    lifted, weights = lift_weights(mod)
    target = tvm.target.Target({"kind": "llvm"})
    before = relax.VirtualMachine(tvm.compile(mod, target), tvm.cpu())
    after = relax.VirtualMachine(tvm.compile(lifted, target), tvm.cpu())
    rng = np.random.default_rng(22)
    for _ in range(2):
        x = tvm.runtime.tensor(rng.standard_normal((4, 32)).astype(np.float32))
        for name in ("main", "twice"):
            np.testing.assert_array_equal(after[name](x, weights).numpy(), before[name](x).numpy())
        np.testing.assert_allclose(after["main"](x, weights).numpy(), x.numpy().astype(np.float64) @ w + b,
                                   rtol=1e-5, atol=1e-5)


def test_a_weight_in_a_function_no_caller_passes_it_to_is_left_inside():
    mod, _, _ = _module(private_weight=True)
    assert lift_weights(mod) is None


def test_a_weight_is_a_large_cpu_tensor_of_a_dtype_numpy_maps():
    from aicf_tvm.driver.weights_apart import is_weight

    big = MIN_BYTES // 4
    assert is_weight(relax.const(np.zeros(big, np.float32)))
    assert not is_weight(relax.const(np.zeros(big - 1, np.float32)))  # below MIN_BYTES: stays
    assert is_weight(relax.const(np.zeros(MIN_BYTES, np.int8)))
    assert not is_weight(relax.const(tvm.runtime.empty((MIN_BYTES,), "bfloat16")))  # numpy takes no DLPack bf16
