"""Tests for the CPU conv2d rule (schedules/cpu/conv2d.py): implicit GEMM on NCHW/OIHW.

Fused conv2d groups (conv2d + bias [1, C, 1, 1] + relu, optionally a residual add) are
built from Relax, scheduled with ``Conv2d``, run on the host CPU and compared with a
float64 numpy convolution on seeded inputs. Sizes are small and odd (15x15, 15x9) so that
position and channel tails, stride 2 and padding are all exercised.
"""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

from schedules.cpu.conv2d import Conv2d
from tests.schedules.test_cpu_gemm import check_rule, fused_primfunc, random_inputs, target

__all__ = ["target"]  # the pytest fixture, shared with the GEMM tests


def conv2d_reference(x: np.ndarray, w: np.ndarray, stride: int, pad: int, groups: int):
    """NCHW/OIHW convolution in float64, one kernel tap at a time."""
    n, _, h, wd = x.shape
    oc, icg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, oc, oh, ow))
    ocg = oc // groups
    for g in range(groups):
        xs, ws = xp[:, g * icg : (g + 1) * icg], w[g * ocg : (g + 1) * ocg].astype(np.float64)
        for r in range(kh):
            for q in range(kw):
                patch = xs[:, :, r : r + stride * oh : stride, q : q + stride * ow : stride]
                out[:, g * ocg : (g + 1) * ocg] += np.einsum("nchw,oc->nohw", patch, ws[:, :, r, q])
    return out


def conv_case(ic, oc, h, k, stride=1, pad=0, groups=1, n=1, w=None, residual=False):
    """(PrimFunc, inputs, expected) for relu(conv2d(x, w) + b [+ r])."""
    wd = w or h
    oh, ow = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
    shapes = {"x": (n, ic, h, wd), "w": (oc, ic // groups, k, k), "b": (1, oc, 1, 1)}
    if residual:
        shapes["r"] = (n, oc, oh, ow)

    def build(bb, x, weight, b, *rest):
        y = bb.emit(relax.op.nn.conv2d(x, weight, strides=stride, padding=pad, groups=groups))
        y = bb.emit(relax.op.add(y, b))
        if rest:
            y = bb.emit(relax.op.add(y, rest[0]))
        return relax.op.nn.relu(y)

    a = random_inputs(shapes)
    expected = conv2d_reference(a["x"], a["w"], stride, pad, groups) + a["b"]
    if residual:
        expected = expected + a["r"]
    return fused_primfunc(build, shapes), a, np.maximum(expected, 0).astype(np.float32)


CASES = {
    "3x3-stride2-pad1": {"ic": 8, "oc": 16, "h": 15, "k": 3, "stride": 2, "pad": 1},
    "1x1": {"ic": 8, "oc": 20, "h": 9, "k": 1},
    "7x7-stride2-pad3": {"ic": 3, "oc": 16, "h": 23, "k": 7, "stride": 2, "pad": 3},
    "depthwise-3x3": {"ic": 8, "oc": 8, "h": 15, "k": 3, "pad": 1, "groups": 8},
    "grouped-3x3": {"ic": 8, "oc": 16, "h": 9, "k": 3, "pad": 1, "groups": 4},
    "grouped-1x1-batch2-residual": {"ic": 12, "oc": 12, "h": 7, "k": 1, "groups": 3, "n": 2, "residual": True},
    "grouped-3x3-stride2-multiplier": {"ic": 6, "oc": 18, "h": 11, "k": 3, "stride": 2, "pad": 1, "groups": 2},
    "batch2-nonsquare-residual": {
        "ic": 6,
        "oc": 12,
        "h": 15,
        "w": 9,
        "k": 3,
        "pad": 1,
        "n": 2,
        "residual": True,
    },
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_conv2d_bias_relu_matches_numpy(target, case):
    func, arrays, expected = conv_case(**case)
    check_rule(Conv2d(), func, target, arrays, expected)


def test_channels_orientation_matches_numpy(target):
    """The other GEMM orientation (channels vectorised, weight packed) is also exact."""
    func, arrays, expected = conv_case(**CASES["3x3-stride2-pad1"])
    check_rule(Conv2d(vector_axis="channels"), func, target, arrays, expected)


def test_grouped_conv_is_a_batched_gemm_over_groups(target):
    """f // F_g * C_g + c indexing: the rule splits f into (group, channel) first, so the
    im2col buffer holds each input element once per (r, q) tap, not once per output channel."""
    ic, oc, h, k, groups = 8, 16, 9, 3, 4
    func, arrays, expected = conv_case(ic=ic, oc=oc, h=h, k=k, pad=1, groups=groups)
    sch = Conv2d().apply(func, target, False)
    assert sch is not None
    root = sch.get(sch.get_sblock("root"))
    sizes = [int(np.prod([int(d) for d in b.shape])) for b in root.alloc_buffers]
    im2col = ic * k * k * h * h  # every tap of every input channel at every position
    assert max(sizes) < 2 * im2col, f"a buffer of {max(sizes)} elements replicates the input"
    check_rule(Conv2d(), func, target, arrays, expected)


def test_grouped_conv_channels_orientation_matches_numpy(target):
    func, arrays, expected = conv_case(**CASES["grouped-3x3"])
    check_rule(Conv2d(vector_axis="channels"), func, target, arrays, expected)


def test_returns_none_for_a_matmul(target):
    func = fused_primfunc(lambda bb, x, w: relax.op.matmul(x, w), {"x": (8, 16), "w": (16, 4)})
    assert Conv2d().apply(func, target, False) is None


def test_rejects_an_unknown_vector_axis():
    with pytest.raises(ValueError, match="vector_axis"):
        Conv2d(vector_axis="rows")
