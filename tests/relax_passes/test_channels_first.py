"""ChannelsFirst: a closed channels-last island (a ConvNeXt block's permute, LayerNorm,
Linear layers, GELU, per-channel scale, permute back) becomes NCHW ops computing the
same values; an island whose channels-last values are needed elsewhere stays."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

import aicf_tvm
from relax_passes.channels_first import ChannelsFirst

from ..conftest import run_vm
from .helpers import op_names


def convnext_block(rng: np.random.Generator, c: int = 16, size: int = 6, leak: bool = False) -> tvm.IRModule:
    """x + permute(γ * (gelu(ln(permute(dwconv(x))) @ W1 + b1) @ W2 + b2)); with ``leak``
    the LayerNorm's channels-last output is also returned (the island is not closed)."""
    def const(*shape):
        return relax.const((rng.standard_normal(shape) * 0.5).astype("float32"))

    x = relax.Var("x", relax.TensorType((1, c, size, size), "float32"))
    hw = size * size
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            d = bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(x, const(c, 1, 3, 3), padding=1, groups=c)),
                                     const(1, c, 1, 1)))
            p = bb.emit(relax.op.permute_dims(d, [0, 2, 3, 1]))
            n = bb.emit(relax.op.nn.layer_norm(p, const(c), const(c), axes=[-1]))
            r = bb.emit(relax.op.reshape(n, (hw, c)))
            m = bb.emit(relax.op.matmul(r, const(c, 4 * c)))
            h = bb.emit(relax.op.nn.gelu(bb.emit(relax.op.add(const(4 * c), m))))
            o = bb.emit(relax.op.add(const(c), bb.emit(relax.op.matmul(h, const(4 * c, c)))))
            s = bb.emit(relax.op.multiply(const(c), bb.emit(relax.op.reshape(o, (1, size, size, c)))))
            q = bb.emit(relax.op.permute_dims(s, [0, 3, 1, 2]))
            y = bb.emit(relax.op.add(x, q))
            out = bb.emit_output(relax.Tuple([y, n]) if leak else y)
        bb.emit_func_output(out)
    return bb.get()


def test_closed_island_becomes_nchw_ops_with_the_same_values():
    rng = np.random.default_rng(0)
    mod = convnext_block(rng)
    after = ChannelsFirst()(mod)
    names = op_names(after)
    assert "relax.permute_dims" not in names and "relax.matmul" not in names and "relax.reshape" not in names
    assert names.count("relax.nn.conv2d") == 3
    for x in (rng.standard_normal((1, 16, 6, 6)).astype("float32") for _ in range(2)):
        np.testing.assert_allclose(run_vm(after, x)[0], run_vm(mod, x)[0], rtol=1e-5, atol=1e-5)


def test_island_whose_channels_last_values_leave_stays():
    rng = np.random.default_rng(1)
    mod = convnext_block(rng, leak=True)
    assert op_names(ChannelsFirst()(mod)) == op_names(mod)


def test_permute_pair_without_a_linear_layer_or_norm_stays():
    """Only islands with a Linear layer or a LayerNorm gain (they join the blocked chain);
    a bare permute -> relu -> permute is left to EliminateEmits and fusion."""
    x = relax.Var("x", relax.TensorType((1, 8, 4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            p = bb.emit(relax.op.permute_dims(x, [0, 2, 3, 1]))
            out = bb.emit_output(relax.op.permute_dims(bb.emit(relax.op.nn.relu(p)), [0, 3, 1, 2]))
        bb.emit_func_output(out)
    mod = bb.get()
    assert op_names(ChannelsFirst()(mod)) == op_names(mod)


def test_island_of_a_lone_layer_norm_becomes_a_norm_over_the_channels():
    """ConvNeXt's downsampling LayerNorm: permute, LayerNorm(-1), permute back."""
    rng = np.random.default_rng(3)
    x = relax.Var("x", relax.TensorType((1, 16, 5, 5), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            p = bb.emit(relax.op.permute_dims(x, [0, 2, 3, 1]))
            g, b = (relax.const(rng.standard_normal(16).astype("float32")) for _ in range(2))
            n = bb.emit(relax.op.nn.layer_norm(p, g, b, axes=[-1]))
            out = bb.emit_output(relax.op.permute_dims(n, [0, 3, 1, 2]))
        bb.emit_func_output(out)
    mod = bb.get()
    after = ChannelsFirst()(mod)
    assert op_names(after) == ["relax.nn.layer_norm"]
    xv = rng.standard_normal((1, 16, 5, 5)).astype("float32")
    np.testing.assert_allclose(run_vm(after, xv)[0], run_vm(mod, xv)[0], rtol=1e-5, atol=1e-5)


def test_compiled_block_runs_blocked_without_layout_conversions_inside():
    """Through the pipeline: the block is one blocked chain (LayerNorm over the blocked
    channels, Linear layers as blocked 1x1 convolutions); only its input and output are
    converted, and the result equals the unoptimized build."""
    rng = np.random.default_rng(2)
    mod = convnext_block(rng, c=64, size=14)
    compiled = aicf_tvm.compile(mod, target={"kind": "llvm", "num-cores": 2})
    [chain] = [d for d in compiled.report.decisions if d.candidate == "materialize:layout"]
    assert chain.accepted and "1 entering and 1 leaving" in chain.note and "3 convolutions" in chain.note
    x = rng.standard_normal((1, 64, 14, 14)).astype("float32")
    np.testing.assert_allclose(np.asarray(compiled(x)), run_vm(mod, x)[0], rtol=1e-4, atol=1e-4)


def test_pointwise_op_with_a_channel_axis_keeps_the_island_channels_last():
    """prelu(x, alpha, axis=3) names the NHWC channel axis: no NCHW twin without renaming
    it, so the island stays (and the result is the model's)."""
    rng = np.random.default_rng(4)
    x = relax.Var("x", relax.TensorType((1, 8, 4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            p = bb.emit(relax.op.permute_dims(x, [0, 2, 3, 1]))
            g, b = (relax.const(rng.standard_normal(8).astype("float32")) for _ in range(2))
            n = bb.emit(relax.op.nn.layer_norm(p, g, b, axes=[-1]))
            a = bb.emit(relax.op.nn.prelu(n, relax.const(rng.uniform(0, 1, 8).astype("float32")), axis=3))
            out = bb.emit_output(relax.op.permute_dims(a, [0, 3, 1, 2]))
        bb.emit_func_output(out)
    mod = bb.get()
    assert op_names(ChannelsFirst()(mod)) == op_names(mod)
