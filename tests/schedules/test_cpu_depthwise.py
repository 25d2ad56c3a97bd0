"""Tests for the CPU depthwise conv2d rule (schedules/cpu/depthwise.py): direct NCHW.

Fused depthwise groups (conv2d with groups == channels + bias [1, C, 1, 1] + ReLU6 or
relu, optionally a residual add) are built from Relax, scheduled with ``Depthwise``, run on
the host CPU and compared with a float64 numpy convolution on seeded inputs. Widths are
odd (7, 15) and large (112) so whole-row vectors of every length, stride 2, padding,
dilation and a channel multiplier are exercised.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import aicf_tvm
from schedules import default_rules, schedule_func
from schedules.cpu.depthwise import Depthwise, rows_per_task
from tests.schedules.test_cpu_gemm import check_rule, fused_primfunc, random_inputs, target

__all__ = ["target"]  # the pytest fixture, shared with the GEMM tests


def depthwise_reference(x, w, stride: int, pad: int, dilation: int) -> np.ndarray:
    """NCHW depthwise convolution (OIHW weight, ``oc // ic`` outputs per input) in float64."""
    n, ic, h, wd = x.shape
    oc, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd + 2 * pad - dilation * (kw - 1) - 1) // stride + 1
    xs = np.repeat(xp, oc // ic, axis=1)  # output channel f reads input channel f // (oc // ic)
    out = np.zeros((n, oc, oh, ow))
    for r in range(kh):
        for q in range(kw):
            rows, cols = r * dilation, q * dilation
            patch = xs[:, :, rows : rows + stride * oh : stride, cols : cols + stride * ow : stride]
            out += patch * w[None, :, 0, r, q, None, None].astype(np.float64)
    return out


def depthwise_case(c, h, k, stride=1, pad=0, dilation=1, n=1, multiplier=1, residual=False, relu6=True):
    """(PrimFunc, inputs, expected) for act(depthwise_conv2d(x, w) + b [+ r])."""
    oh = (h + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    oc = c * multiplier
    shapes = {"x": (n, c, h, h), "w": (oc, 1, k, k), "b": (1, oc, 1, 1)}
    if residual:
        shapes["r"] = (n, oc, oh, oh)

    def build(bb, x, weight, b, *rest):
        y = bb.emit(
            relax.op.nn.conv2d(x, weight, strides=stride, padding=pad, dilation=dilation, groups=c)
        )
        y = bb.emit(relax.op.add(y, b))
        if rest:
            y = bb.emit(relax.op.add(y, rest[0]))
        return relax.op.clip(y, 0.0, 6.0) if relu6 else relax.op.nn.relu(y)

    a = random_inputs(shapes)
    expected = depthwise_reference(a["x"], a["w"], stride, pad, dilation) + a["b"]
    if residual:
        expected = expected + a["r"]
    expected = np.clip(expected, 0, 6) if relu6 else np.maximum(expected, 0)
    return fused_primfunc(build, shapes), a, expected.astype(np.float32)


CASES = {
    "3x3-7x7": {"c": 8, "h": 7, "k": 3, "pad": 1},
    "3x3-14x14-batch2-residual": {"c": 6, "h": 14, "k": 3, "pad": 1, "n": 2, "residual": True},
    "3x3-stride2-15x15": {"c": 5, "h": 15, "k": 3, "stride": 2, "pad": 1},
    "3x3-stride2-112x112": {"c": 3, "h": 112, "k": 3, "stride": 2, "pad": 1},
    "3x3-112x112-relu": {"c": 2, "h": 112, "k": 3, "pad": 1, "relu6": False},
    "3x3-stride2-nopad-odd": {"c": 4, "h": 113, "k": 3, "stride": 2},
    "5x5-stride2-15x15": {"c": 4, "h": 15, "k": 5, "stride": 2, "pad": 2},
    "7x7-14x14": {"c": 4, "h": 14, "k": 7, "pad": 3},
    "3x3-dilation2": {"c": 4, "h": 15, "k": 3, "pad": 2, "dilation": 2},
    "3x3-multiplier2": {"c": 3, "h": 9, "k": 3, "pad": 1, "multiplier": 2},
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_depthwise_matches_numpy(target, case):
    func, arrays, expected = depthwise_case(**case)
    check_rule(Depthwise(), func, target, arrays, expected)


def test_default_rules_give_depthwise_convolutions_the_direct_schedule(target):
    func, _, _ = depthwise_case(**CASES["3x3-7x7"])
    scheduled = schedule_func(func, target, default_rules(target))
    assert scheduled is not None and scheduled.attrs["aicf.schedule"] == "Depthwise"


def test_compiled_model_runs_its_depthwise_kernel_with_the_direct_schedule():
    """Through the whole pipeline: the kernel table names the rule, the result is exact."""
    c, h = 16, 15
    x = relax.Var("x", relax.TensorType((1, c, h, h), "float32"))
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((c, 1, 3, 3), dtype=np.float32)
    bias = rng.standard_normal((1, c, 1, 1), dtype=np.float32)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(weight), strides=2, padding=1, groups=c))
            y = bb.emit(relax.op.add(y, relax.const(bias)))
            out = bb.emit_output(relax.op.clip(y, 0.0, 6.0))
        bb.emit_func_output(out)
    compiled = aicf_tvm.compile(bb.get(), target="llvm")
    schedules = {k.schedule for k in compiled.kernels if "conv2d" in k.kind}
    assert schedules == {"Depthwise"}, [(k.name, k.kind, k.schedule) for k in compiled.kernels]
    data = rng.standard_normal((1, c, h, h), dtype=np.float32)
    got = np.asarray(compiled(data))
    expected = np.clip(depthwise_reference(data, weight, 2, 1, 1) + bias, 0, 6)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_returns_none_for_a_dense_convolution(target):
    def build(bb, x, w):
        return relax.op.nn.conv2d(x, w, padding=1)

    func = fused_primfunc(build, {"x": (1, 4, 9, 9), "w": (8, 4, 3, 3)})
    assert Depthwise().apply(func, target, False) is None


def test_returns_none_for_a_matmul(target):
    func = fused_primfunc(lambda bb, x, w: relax.op.matmul(x, w), {"x": (8, 16), "w": (16, 4)})
    assert Depthwise().apply(func, target, False) is None


def test_rows_per_task_splits_planes_only_when_channels_are_few():
    assert rows_per_task(planes=96, height=56, cores=2) == 56
    assert rows_per_task(planes=2, height=56, cores=2) == 14  # 2 planes x 4 blocks = 8 tasks
    assert rows_per_task(planes=1, height=7, cores=4) == 1


def test_rows_per_task_gives_every_core_the_same_number_of_tasks():
    assert rows_per_task(planes=9, height=56, cores=2) == 28  # 18 tasks, not 9 (5 against 4)
    assert rows_per_task(planes=24, height=14, cores=2) == 14  # whole planes already even
    assert rows_per_task(planes=2, height=112, cores=2) == 28  # 8 tasks, not one per row


def test_stride2_input_is_read_through_a_deinterleaved_copy(target):
    """Stride 2 reads the input through a [.., row, x % 2, x // 2] copy (contiguous vector
    loads), odd input width included; the result stays exact."""
    func, arrays, expected = depthwise_case(**CASES["3x3-stride2-nopad-odd"])
    sch = check_rule(Depthwise(), func, target, arrays, expected)
    root = sch.get(sch.get_sblock("root"))
    assert any(len(buf.shape) == 5 for buf in root.alloc_buffers), root.alloc_buffers


def test_returns_none_for_a_symbolic_batch(target):
    batch = tvm.tirx.Var("n", "int64")

    def build(bb, x, w):
        return relax.op.nn.conv2d(x, w, padding=1, groups=4)

    func = fused_primfunc(build, {"x": (batch, 4, 9, 9), "w": (4, 1, 3, 3)})
    assert Depthwise().apply(func, target, False) is None
