"""ClipPoolWindows: an average pool whose one window covers its whole input becomes a pool
of exactly that input, the same bits; every other pool stays.

References are the unoptimized TVM build of the module before the pass (bit for bit) and
PyTorch's ``AvgPool*d`` as ``transformers``' EfficientNet calls it. Inputs carry NaN, ±inf
and -0.0 (one channel all -0.0), where dropping the padding's +0.0 terms could show.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

from relax_passes.clip_pool_windows import ClipPoolWindows

from ..conftest import run_vm

_POOL = {1: relax.op.nn.avg_pool1d, 2: relax.op.nn.avg_pool2d, 3: relax.op.nn.avg_pool3d}
_MAX = {2: relax.op.nn.max_pool2d}


def pool_module(shape, op=None, **attrs) -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output((op or _POOL[len(shape) - 2])(x, **attrs))
        bb.emit_func_output(out)
    return bb.get()


def pool_attrs(mod: tvm.IRModule):
    (binding,) = mod["main"].body.blocks[0].bindings
    return binding.value.attrs


def special_input(shape) -> np.ndarray:
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    x[:, 0] = -0.0  # a channel of -0.0 only
    flat = x[:, 1].reshape(-1)
    flat[[0, 3]] = [np.nan, np.inf]  # a NaN and an inf in one channel
    x[:, 1] = flat.reshape(x[:, 1].shape)
    x[:, 2].reshape(-1)[1] = -np.inf
    return x


@pytest.mark.parametrize("count_include_pad", [True, False])
def test_efficientnets_whole_map_pool_is_the_same_function(count_include_pad):
    """``nn.AvgPool2d(64, ceil_mode=True)`` over 7x7 (EfficientNet's pooler, smaller)."""
    shape = (1, 4, 7, 7)
    before = pool_module(shape, pool_size=(64, 64), strides=(64, 64), ceil_mode=True,
                         count_include_pad=count_include_pad)
    after = ClipPoolWindows()(before)
    a = pool_attrs(after)
    assert [int(k) for k in a.pool_size] == [7, 7] and not bool(a.ceil_mode)
    x = special_input(shape)
    other = np.random.default_rng(1).standard_normal(shape).astype("float32")
    (want,) = run_vm(before, x)
    (got,) = run_vm(after, x)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    pool = torch.nn.AvgPool2d(64, ceil_mode=True, count_include_pad=count_include_pad)
    ref = pool(torch.from_numpy(other).double()).numpy()
    assert not np.allclose(ref, pool(torch.from_numpy(other + 1).double()).numpy())
    np.testing.assert_allclose(run_vm(after, other)[0], ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape,attrs,window", [
    ((1, 3, 7, 20), {"pool_size": (64, 4), "strides": (64, 4), "ceil_mode": True}, [7, 4]),  # H only
    ((1, 3, 9), {"pool_size": (9,), "strides": (2,)}, [9]),  # a 1-D window already the input: stays
    ((1, 3, 5, 6, 4), {"pool_size": (8, 8, 8), "strides": (8, 8, 8), "ceil_mode": True}, [5, 6, 4]),
])
def test_only_whole_input_axes_clip(shape, attrs, window):
    before = pool_module(shape, **attrs)
    after = ClipPoolWindows()(before)
    assert [int(k) for k in pool_attrs(after).pool_size] == window
    x = special_input(shape)
    np.testing.assert_array_equal(run_vm(after, x)[0].view(np.uint32), run_vm(before, x)[0].view(np.uint32))


@pytest.mark.parametrize("shape,attrs,op", [
    ((1, 3, 7, 7), {"pool_size": (3, 3), "strides": (2, 2)}, None),  # windows inside the input
    ((1, 3, 7, 7), {"pool_size": (64, 64), "strides": (64, 64), "padding": (1, 1, 1, 1), "ceil_mode": True}, None),
    ((1, 3, 7, 7), {"pool_size": (64, 64), "strides": (64, 64), "ceil_mode": True}, _MAX[2]),  # a max pool
    ((1, 3, 7, 7), {"pool_size": (4, 4), "strides": (4, 4), "dilation": (2, 2), "ceil_mode": True}, None),
])
def test_every_other_pool_stays(shape, attrs, op):
    before = pool_module(shape, op, **attrs)
    tvm.ir.assert_structural_equal(ClipPoolWindows()(before), before)
