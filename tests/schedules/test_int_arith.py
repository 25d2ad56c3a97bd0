"""Integer arithmetic on values wraps in fused CPU kernels (``schedules.cpu.int_arith``).

Fused, ``(x + 1) > x`` of an unsigned ``x`` aborted TIR's simplifier, and for 32- and
64-bit integers LLVM folded it (and ``x - 1 < x``, ``x * x >= 0``) to true through the
``nsw``/``nuw`` flags of TVM's code generation. References: TVM's default build (one kernel
per op) and numpy, which wrap. Index arithmetic stays plain.
"""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.script import tirx as T

import aicf_tvm
from schedules.cpu.int_arith import wrapping_integers

from ..conftest import run_vm

TARGET = {"kind": "llvm", "num-cores": 2}
DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]


def _comparisons(dtype: str, length) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((length,), dtype))

    def c(value: int) -> relax.Expr:
        return relax.const(value, dtype)

    with bb.function("main", [x]):
        with bb.dataflow():
            outs = [relax.op.greater(relax.op.add(x, c(1)), x),
                    relax.op.less(relax.op.subtract(x, c(1)), x),
                    relax.op.greater_equal(relax.op.multiply(x, x), c(0)),
                    relax.op.equal(relax.op.subtract(relax.op.add(x, c(7)), c(7)), x),
                    relax.op.multiply(relax.op.add(x, c(3)), c(5))]
            out = bb.emit_output(relax.Tuple([bb.emit(e) for e in outs]))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_integer_arithmetic_wraps_like_numpy(dtype):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(4)
    edges = np.array([info.min, info.max, 0, 1, info.max - 1, info.min + 1], dtype)
    x = np.concatenate([edges, rng.integers(info.min, info.max, 58, dtype=dtype, endpoint=True)])
    mod = _comparisons(dtype, tirx.Var("n", "int64"))
    got = aicf_tvm.compile(mod, target=TARGET)(x)
    with np.errstate(over="ignore"):
        one, seven = np.array(1, dtype), np.array(7, dtype)
        numpy = [x + one > x, x - one < x, x * x >= 0, (x + seven) - seven == x,
                 (x + np.array(3, dtype)) * np.array(5, dtype)]
    for k, (g, vm, want) in enumerate(zip(got, run_vm(mod, x), numpy)):
        np.testing.assert_array_equal(vm, want, err_msg=f"output {k}: the default build")
        np.testing.assert_array_equal(np.asarray(g), want, err_msg=f"output {k}")


@T.prim_func
def shifted_increment(a: T.Buffer((17,), "int32"), b: T.Buffer((16,), "int32")):
    for i in range(16):
        b[i] = a[i + 1] + 1


def test_only_arithmetic_on_values_is_sealed():
    """The add of a loaded value becomes ``aicf.wrap_add``; the index ``i + 1`` stays."""
    sealed = wrapping_integers(shifted_increment)
    calls, adds = [], []
    tvm_ffi.structural_walk(sealed.body, [(tvm.ir.Call, calls.append), (tirx.Add, adds.append)])
    assert [c.op.name for c in calls] == ["aicf.wrap_add"]
    assert len(adds) == 1 and isinstance(adds[0].b, tirx.IntImm) and adds[0].b.value == 1
