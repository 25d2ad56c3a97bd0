"""``schedules.cpu.full_minmax.FullMinMax``: the min/max of a whole tensor into a scalar,
vectorized, against the same PrimFunc built with its serial loop (``Fallback``: what TVM
computes for the graph) bit for bit, on inputs that make the serial loop's order show:
NaN anywhere (a NaN resets what the loop remembers), the extreme a zero of either sign
(the last such zero wins), all +-inf (the initial value wins), and ordinary values; each
with the accumulator as the first and as the second operand, for shapes whose vector
count is and is not a multiple of the unrolled step. Then a DynamicQuantizeLinear
through ``aicf_tvm.compile`` against ONNX's reference evaluator."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from aicf_tvm.runtime.targets import resolve_target
from schedules.cpu.fallback import Fallback
from schedules.cpu.full_minmax import FullMinMax

HOST = resolve_target("llvm")
FLT_MAX = 3.4028234663852886e38


def _reduction(kind: str, acc_first: bool, shape: tuple[int, ...]):
    op = T.min if kind == "min" else T.max
    init = FLT_MAX if kind == "min" else -FLT_MAX

    @T.prim_func(s_tir=True)
    def func(p0: T.Buffer(shape, "float32"), out: T.Buffer((), "float32")):
        red = T.sblock_alloc_buffer(())
        for k0, k1, k2 in T.grid(*shape):
            with T.sblock("red"):
                v0, v1, v2 = T.axis.remap("RRR", [k0, k1, k2])
                with T.init():
                    red[()] = T.float32(init)
                if acc_first:
                    red[()] = op(red[()], p0[v0, v1, v2])
                else:
                    red[()] = op(p0[v0, v1, v2], red[()])
        with T.sblock("epilogue"):
            T.axis.spatial(1, 0)
            out[()] = op(T.float32(0.5), red[()])

    return func


def _inputs(kind: str, shape: tuple[int, ...], rng) -> list[np.ndarray]:
    sign = 1.0 if kind == "min" else -1.0  # the side the extreme is on
    out = []
    for case in range(64):
        x = rng.standard_normal(shape).astype(np.float32)
        c = case % 8
        if c == 1:  # the extreme a zero, zeros of both signs scattered
            x = (sign * np.abs(x)).astype(np.float32)
            x[rng.random(shape) < 0.2] = 0.0
            x[rng.random(shape) < 0.2] = -0.0
        if c == 2:  # every element a zero
            x = rng.choice(np.array([0.0, -0.0], np.float32), shape)
        if c == 3:  # a NaN somewhere
            x.flat[rng.integers(0, x.size)] = np.nan
        if c == 4:  # the last element NaN
            x.flat[-1] = np.nan
        if c == 5:  # no element reaches the initial value's side
            x[:] = sign * np.inf
        if c == 6:  # several NaNs and a zero extreme
            x = (sign * np.abs(x)).astype(np.float32)
            x[rng.random(shape) < 0.1] = 0.0
            x[rng.random(shape) < 0.05] = np.nan
        out.append(x)
    return out


def _build(func):
    return tvm.compile(tvm.IRModule({"main": func}), target=HOST)["main"]


@pytest.mark.parametrize("shape", [(1, 8, 64), (1, 5, 48), (2, 3, 16)])
@pytest.mark.parametrize("acc_first", [True, False])
@pytest.mark.parametrize("kind", ["min", "max"])
def test_the_vectorized_reduction_gives_the_serial_loops_bits(kind, acc_first, shape):
    func = _reduction(kind, acc_first, shape)
    fast = FullMinMax().apply(func, HOST, False)
    assert fast is not None
    fast, slow = _build(fast.mod["main"]), _build(Fallback().apply(func, HOST, False).mod["main"])
    rng = np.random.default_rng(len(shape) * 7 + shape[1])
    results = set()
    for x in _inputs(kind, shape, rng):
        got, want = tvm.runtime.empty((), "float32"), tvm.runtime.empty((), "float32")
        fast(tvm.runtime.tensor(x), got)
        slow(tvm.runtime.tensor(x), want)
        assert got.numpy().tobytes() == want.numpy().tobytes(), (x, got.numpy(), want.numpy())
        results.add(want.numpy().tobytes())
    assert len(results) > 10  # the inputs give many different answers


def test_a_reduction_the_rule_does_not_take_is_left_to_others():
    @T.prim_func(s_tir=True)
    def row_min(p0: T.Buffer((4, 32), "float32"), out: T.Buffer((4,), "float32")):
        for i, k in T.grid(4, 32):
            with T.sblock("red"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    out[vi] = T.float32(FLT_MAX)
                out[vi] = T.min(out[vi], p0[vi, vk])

    assert FullMinMax().apply(row_min, HOST, False) is None
    assert FullMinMax().apply(_reduction("min", True, (1, 3, 5)), HOST, False) is None  # 5 columns: no vectors


def test_dynamic_quantize_linear_equals_onnx_reference():
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    import aicf_tvm

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 96])
    outs = [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 64, 96]),
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("zp", TensorProto.UINT8, [])]
    graph = helper.make_graph([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "scale", "zp"])],
                              "dql", [x], outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    compiled = aicf_tvm.compile(model)
    kernels = [str(f.attrs["aicf.schedule"]) for _, f in compiled.lowered.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and "aicf.schedule" in f.attrs]
    assert kernels.count("FullMinMax") == 2  # its min and its max
    ref = ReferenceEvaluator(model)
    rng = np.random.default_rng(2)
    for data in (rng.standard_normal((1, 64, 96)).astype(np.float32) * 3,
                 np.maximum(rng.standard_normal((1, 64, 96)), 0).astype(np.float32),  # min exactly 0
                 -np.abs(rng.standard_normal((1, 64, 96))).astype(np.float32)):  # max below 0
        got = compiled(data)
        want = ref.run(None, {"x": data})
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
