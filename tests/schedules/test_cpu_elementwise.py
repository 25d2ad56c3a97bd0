"""CPU Elementwise and Fallback rules on injective PrimFuncs.

Each case lowers a small Relax function (LegalizeOps, FuseOps, FuseTIR), schedules its
PrimFuncs with the rule under test, and compares the VM output with numpy.
"""

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.script import relax as R
from tvm.script import tirx as T
from tvm.target import Target

from schedules.cpu import Elementwise, Fallback

TARGET = Target({**Target.from_device(tvm.cpu()).export(), "num-cores": 2})


def relax_module(shapes: list[tuple], body: Callable, dtypes: list[str] | None = None):
    """A legalized, fused module whose ``main`` computes ``body(*params)``."""
    dtypes = dtypes or ["float32"] * len(shapes)
    bb = relax.BlockBuilder()
    params = [
        relax.Var(f"p{i}", R.Tensor(shape, dtype))
        for i, (shape, dtype) in enumerate(zip(shapes, dtypes))
    ]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(*params))
        bb.emit_func_output(out)
    passes = [
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination(),
    ]
    return tvm.transform.Sequential(passes)(bb.get())


def prim_funcs(mod: tvm.IRModule) -> dict[str, tirx.PrimFunc]:
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}


def check_rule(rule, mod: tvm.IRModule, inputs: list[np.ndarray], expected: np.ndarray) -> str:
    """Schedule every PrimFunc with ``rule`` (all must accept), compare with numpy, and
    return the scheduled TVMScript."""
    for name, func in prim_funcs(mod).items():
        sch = rule.apply(func, TARGET, False)
        assert sch is not None, f"{type(rule).__name__} rejected {name}"
        mod[name] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
    ex = tvm.compile(mod, target=TARGET)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in inputs])
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)
    return "\n".join(f.script() for f in prim_funcs(mod).values())


def test_elementwise_chain_is_one_parallel_vector_loop(rand):
    x, y = rand(8, 64, 32), rand(8, 64, 32)
    mod = relax_module(
        [x.shape, y.shape],
        lambda a, b: relax.op.nn.relu(relax.op.add(relax.op.multiply(a, b), a)),
    )
    script = check_rule(Elementwise(), mod, [x, y], np.maximum(x * y + x, 0))
    assert script.count("T.sblock(") == 1 + 1  # root and the one fused block
    assert "T.parallel" in script and "T.vectorized" in script


def test_broadcast_bias_add(rand):
    x, b = rand(4, 16, 8, 8), rand(1, 16, 1, 1)
    mod = relax_module([x.shape, b.shape], relax.op.add)
    check_rule(Elementwise(), mod, [x, b], x + b)


def test_odd_row_length_vectorizes_within_rows(rand):
    x = rand(64, 100)
    mod = relax_module([x.shape], lambda a: relax.op.nn.relu(relax.op.multiply(a, a)))
    script = check_rule(Elementwise(), mod, [x], np.maximum(x * x, 0))
    assert "T.vectorized" in script


def test_libm_blocks_stay_scalar_but_parallel(rand):
    """LLVM turns a vector sin into one libm call per lane: no vector loop for it (float32
    exp, erf, tanh, sigmoid and log are vectorized: VectorizeMath expands them)."""
    x = rand(64, 128)
    mod = relax_module([x.shape], lambda a: relax.op.sin(a))
    script = check_rule(Elementwise(), mod, [x], np.sin(x))
    assert "T.vectorized" not in script and "T.parallel" in script


def test_sigmoid_block_is_vectorized(rand):
    x = rand(64, 128)
    mod = relax_module([x.shape], lambda a: relax.op.sigmoid(a))
    script = check_rule(Elementwise(), mod, [x], 1 / (1 + np.exp(-x)))
    assert "T.vectorized" in script and "T.parallel" in script


def test_transpose(rand):
    x = rand(4, 32, 64)
    mod = relax_module([x.shape], lambda a: relax.op.permute_dims(a, [0, 2, 1]))
    check_rule(Elementwise(), mod, [x], x.transpose(0, 2, 1))


def test_reshape_copy(rand):
    x = rand(4, 32, 64)
    mod = relax_module(
        [x.shape], lambda a: relax.op.reshape(relax.op.permute_dims(a, [1, 0, 2]), (32, 256))
    )
    check_rule(Elementwise(), mod, [x], x.transpose(1, 0, 2).reshape(32, 256))


def test_concat(rand):
    x, y = rand(4, 16, 64), rand(4, 8, 64)
    mod = relax_module([x.shape, y.shape], lambda a, b: relax.op.concat([a, b], axis=1))
    check_rule(Elementwise(), mod, [x, y], np.concatenate([x, y], axis=1))


def test_strided_slice(rand):
    x = rand(8, 64, 32)
    mod = relax_module(
        [x.shape], lambda a: relax.op.strided_slice(a, axes=[1], begin=[1], end=[63], strides=[2])
    )
    check_rule(Elementwise(), mod, [x], x[:, 1:63:2])


def test_take_gather_rows(rand):
    table = rand(50, 64)
    idx = rand.rng.integers(0, 50, size=(128,)).astype("int32")
    mod = relax_module(
        [table.shape, idx.shape], lambda t, i: relax.op.take(t, i, axis=0), ["float32", "int32"]
    )
    check_rule(Elementwise(), mod, [table, idx], table[idx])


def test_small_tensor_is_not_parallel(rand):
    """Launching threads for 64 elements costs more than the work."""
    x = rand(4, 16)
    mod = relax_module([x.shape], lambda a: relax.op.exp(a))
    script = check_rule(Elementwise(), mod, [x], np.exp(x))
    assert "T.parallel" not in script


def test_elementwise_rejects_reductions_and_gpu_targets():
    mod = relax_module([(16, 64)], lambda a: relax.op.sum(a, axis=[1]))
    (func,) = prim_funcs(mod).values()
    assert Elementwise().apply(func, TARGET, False) is None
    mod = relax_module([(16, 64)], lambda a: relax.op.exp(a))
    (func,) = prim_funcs(mod).values()
    assert Elementwise().apply(func, Target({"kind": "cuda", "arch": "sm_90"}), False) is None


def test_fallback_parallelizes_any_primfunc(rand):
    x = rand(64, 128)
    mod = relax_module([x.shape], lambda a: relax.op.nn.softmax(a))
    script = check_rule(Fallback(), mod, [x], np.exp(x) / np.exp(x).sum(-1, keepdims=True))
    assert "T.parallel" in script


@T.prim_func(s_tir=True)
def prefix_sum(a: T.Buffer((64, 128), "float32"), b: T.Buffer((64, 128), "float32")):
    # Opaque: the inner loop carries a dependence NormalizePrimFunc cannot describe.
    for i in range(64):
        with T.sblock("scan"):
            vi = T.axis.spatial(64, i)
            T.reads(a[vi, 0:128])
            T.writes(b[vi, 0:128])
            b[vi, 0] = a[vi, 0]
            for j in range(1, 128):
                b[vi, j] = b[vi, j - 1] + a[vi, j]


@T.prim_func(s_tir=True)
def serial_scan(a: T.Buffer((128,), "float32"), b: T.Buffer((128,), "float32")):
    with T.sblock("scan"):
        T.reads(a[0:128])
        T.writes(b[0:128])
        b[0] = a[0]
        for j in range(1, 128):
            b[j] = b[j - 1] + a[j]


def test_fallback_parallelizes_opaque_rows_only_when_proved():
    sch = Fallback().apply(prefix_sum, TARGET, False)
    assert sch is not None
    assert "T.parallel(64)" in sch.mod["main"].script()
    unchanged = Fallback().apply(serial_scan, TARGET, False)
    assert unchanged is not None  # Fallback accepts everything, even what it cannot improve
    tvm.ir.assert_structural_equal(unchanged.mod["main"], serial_scan)


def test_fallback_result_matches_numpy_on_opaque_block(rand):
    sch = Fallback().apply(prefix_sum, TARGET, False)
    lib = tvm.compile(sch.mod, target=TARGET)
    a = rand(64, 128)
    b = tvm.runtime.tensor(np.zeros_like(a))
    lib["main"](tvm.runtime.tensor(a), b)
    np.testing.assert_allclose(b.numpy(), np.cumsum(a, axis=1), rtol=1e-4, atol=1e-4)


def test_fallback_leaves_a_block_of_zero_extent_alone():
    """A slice of zero width (Phi-3's pass-through part of a full rotary) is a loop of
    extent 0 beside a symbolic one: the rule must not fuse them (TVM divides by the extent
    and raised, leaving the kernel unscheduled with a warning)."""

    @T.prim_func(s_tir=True)
    def with_empty(var_a: T.handle, var_b: T.handle, var_c: T.handle):
        n = T.int64()
        a = T.match_buffer(var_a, (n, 16), "float32")
        b = T.match_buffer(var_b, (n, 0), "float32")
        c = T.match_buffer(var_c, (n, 16), "float32")
        for i, j in T.grid(n, T.int64(0)):
            with T.sblock("empty"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = T.float32(0)
        for i, j in T.grid(n, T.int64(16)):
            with T.sblock("copy"):
                vi, vj = T.axis.remap("SS", [i, j])
                c[vi, vj] = a[vi, vj]

    sch = Fallback().apply(with_empty, TARGET, False)
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target=TARGET)
    a = np.arange(64, dtype=np.float32).reshape(4, 16)
    c = tvm.runtime.empty((4, 16), "float32")
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.empty((4, 0), "float32"), c)
    np.testing.assert_array_equal(c.numpy(), a)
