"""FoldPadIntoConv: a zero spatial pad before a convolution becomes the convolution's own
padding only where that is the same function; every other pad stays.

References are PyTorch (``F.pad`` then ``F.conv*d``) and the unoptimized TVM build of the
module before the fold. Inputs carry NaN and ±inf on the borders, where the pad value
decides what the border windows see.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import aicf_tvm
from relax_passes.fold_pad import FoldPadIntoConv, folded_padding

from ..conftest import run_vm
from .helpers import op_names

_CONV = {1: relax.op.nn.conv1d, 2: relax.op.nn.conv2d, 3: relax.op.nn.conv3d}
_TORCH_CONV = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d, 3: torch.nn.functional.conv3d}


def pad_conv(x_shape, w_shape, widths, *, stride=1, padding=0, dilation=1, groups=1,
             mode="constant", value=0.0) -> tvm.IRModule:
    """``conv(pad(x, widths, mode, value), w)``; ``widths`` per axis as (before, after)."""
    rank = len(x_shape) - 2
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    w = relax.Var("w", relax.TensorType(w_shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            p = bb.emit(relax.op.nn.pad(x, [v for pair in widths for v in pair], mode, value))
            y = bb.emit(_CONV[rank](p, w, strides=stride, padding=padding, dilation=dilation, groups=groups))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def torch_reference(x, w, widths, stride, padding, dilation, groups, value=0.0) -> np.ndarray:
    """PyTorch's pad (last axis first) then its convolution, in float64."""
    torch_widths = [v for pair in reversed(widths[2:]) for v in pair]
    xt = torch.nn.functional.pad(torch.from_numpy(x).double(), torch_widths, value=value)
    conv = _TORCH_CONV[x.ndim - 2]
    return conv(xt, torch.from_numpy(w).double(), stride=stride, padding=padding, dilation=dilation,
                groups=groups).numpy()


def border_specials(rng: np.random.Generator, shape) -> np.ndarray:
    """Random values with NaN, +inf and -inf on the first and last positions of each
    spatial axis, where a nonzero pad value would change the border windows."""
    x = rng.standard_normal(shape).astype("float32")
    flat = x.reshape(shape[0], shape[1], -1)
    flat[:, 0, 0] = np.nan
    flat[:, -1, -1] = np.inf
    x[(slice(None), slice(None), *[-1] * (len(shape) - 2))] = -np.inf
    x[(slice(None), 0, *[0] * (len(shape) - 3), -1)] = np.inf
    return x


# (x shape, w shape, widths, stride, conv padding, dilation, groups)
CASES = {
    "tf-same-depthwise-stride2": ((1, 6, 10, 10), (6, 1, 3, 3), ((0, 0), (0, 0), (0, 1), (0, 1)), 2, 0, 1, 6),
    "dense-3x3-on-conv-padding": ((2, 3, 9, 7), (5, 3, 3, 3), ((0, 0), (0, 0), (1, 2), (2, 0)), 1, 1, 1, 1),
    "grouped-strided": ((1, 4, 11, 11), (6, 2, 3, 3), ((0, 0), (0, 0), (1, 1), (1, 1)), 2, 0, 1, 2),
    "dilated": ((1, 3, 12, 12), (4, 3, 3, 3), ((0, 0), (0, 0), (2, 2), (2, 2)), 1, 0, 2, 1),
    "1x1-padded": ((1, 3, 5, 5), (4, 3, 1, 1), ((0, 0), (0, 0), (1, 0), (0, 1)), 1, 0, 1, 1),
    "conv1d": ((2, 3, 13), (4, 3, 5), ((0, 0), (0, 0), (2, 3)), 1, 0, 1, 1),
    "conv3d": ((1, 2, 5, 6, 7), (3, 2, 3, 3, 3), ((0, 0), (0, 0), (1, 0), (0, 1), (1, 1)), 1, 0, 1, 1),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_zero_pad_folds_and_matches_torch_and_the_unfolded_build(case):
    x_shape, w_shape, widths, stride, padding, dilation, groups = case
    mod = pad_conv(x_shape, w_shape, widths, stride=stride, padding=padding, dilation=dilation, groups=groups)
    folded = relax.transform.DeadCodeElimination()(FoldPadIntoConv()(mod))
    assert "relax.nn.pad" not in op_names(folded)
    rng = np.random.default_rng(0)
    x, w = border_specials(rng, x_shape), rng.standard_normal(w_shape).astype("float32")
    want = torch_reference(x, w, widths, stride, padding, dilation, groups)
    assert np.isnan(want).any() and np.isinf(want).any()  # the specials reach the output
    unfolded = run_vm(mod, x, w)[0]
    for got in (run_vm(folded, x, w)[0], np.asarray(aicf_tvm.compile(mod, target="llvm")(x, w))):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got, unfolded, rtol=1e-5, atol=1e-5)


REFUSED = {
    "value-one": {"value": 1.0},
    "value-negative-zero": {"value": -0.0},
    "reflect": {"mode": "reflect"},
    "channel-pad": {"widths": ((0, 0), (1, 0), (1, 1), (1, 1))},
    "crop": {"widths": ((0, 0), (0, 0), (-1, 0), (1, 1))},
}


@pytest.mark.parametrize("change", REFUSED.values(), ids=REFUSED.keys())
def test_pad_that_is_not_the_convolution_padding_stays(change):
    """Only a +0.0 constant pad of the spatial axes is what the convolution pads with."""
    widths = change.pop("widths", ((0, 0), (0, 0), (1, 1), (1, 1)))
    w_shape = (4, 4, 3, 3) if widths[1] != (0, 0) else (4, 3, 3, 3)
    mod = pad_conv((1, 3, 8, 8), w_shape, widths, **change)
    got = FoldPadIntoConv()(mod)
    assert op_names(got) == ["relax.nn.pad", "relax.nn.conv2d"]


def test_pad_value_one_compiles_to_what_torch_computes():
    """A refused fold still computes the right thing: border windows see the value 1.0."""
    widths = ((0, 0), (0, 0), (1, 1), (1, 1))
    mod = pad_conv((1, 3, 8, 8), (4, 3, 3, 3), widths, value=1.0)
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((1, 3, 8, 8)).astype("float32"), rng.standard_normal((4, 3, 3, 3)).astype("float32")
    got = np.asarray(aicf_tvm.compile(mod, target="llvm")(x, w))
    np.testing.assert_allclose(got, torch_reference(x, w, widths, 1, 0, 1, 1, value=1.0), rtol=1e-5, atol=1e-5)


def test_pad_read_by_another_op_stays_for_it():
    x = relax.Var("x", relax.TensorType((1, 3, 6, 6), "float32"))
    w = relax.Var("w", relax.TensorType((2, 3, 3, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            p = bb.emit(relax.op.nn.pad(x, [0, 0, 0, 0, 1, 1, 1, 1]))
            y = bb.emit(relax.op.nn.conv2d(p, w))
            out = bb.emit_output(relax.Tuple([y, bb.emit(relax.op.nn.relu(p))]))
        bb.emit_func_output(out)
    got = relax.transform.DeadCodeElimination()(FoldPadIntoConv()(bb.get()))
    assert op_names(got) == ["relax.nn.pad", "relax.nn.conv2d", "relax.nn.relu"]
    conv = next(b.value for b in got["main"].body.blocks[0].bindings if getattr(b.value, "op", None)
                == tvm.ir.Op.get("relax.nn.conv2d"))
    assert conv.args[0].same_as(x) and [int(p) for p in conv.attrs.padding] == [1, 1, 1, 1]


def test_folded_padding_adds_befores_and_afters_per_spatial_axis():
    x = relax.Var("x", relax.TensorType((1, 2, 8, 8), "float32"))
    w = relax.Var("w", relax.TensorType((2, 2, 3, 3), "float32"))
    pad = relax.op.nn.pad(x, [0, 0, 0, 0, 1, 2, 3, 4])
    conv = relax.op.nn.conv2d(x, w, padding=(10, 20, 30, 40))  # (top, left, bottom, right)
    assert folded_padding(pad, conv) == (11, 23, 32, 44)


def test_compiled_mobilenet_style_block_runs_no_pad_kernel():
    """TensorFlow-style "SAME" padding (HF MobileNetV2) is an explicit pad before each
    depthwise conv; it must run inside the conv kernel, not as a kernel of its own."""
    mod = pad_conv((1, 8, 14, 14), (8, 1, 3, 3), ((0, 0), (0, 0), (0, 1), (0, 1)), stride=2, groups=8)
    compiled = aicf_tvm.compile(mod, target="llvm")
    kinds = [k.kind for k in compiled.kernels]
    assert len(kinds) == 1 and "pad" not in kinds, kinds
