"""MaterializeEmits' layout step (relax_passes/materialize_layouts.py): convolution chains
take the blocked layout when the cost table says so, with layout_transform Emits at the
chain's boundaries only; the result equals the unoptimized TVM build (NaN and ±inf
included), and every chain is in the report with its costs.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import aicf_tvm
from aicf_tvm.core.emit_graph import EmitGraph
from aicf_tvm.core.kinds.layouts import blocking_map, transform_layouts, unblocking_map
from aicf_tvm.core.report import FusionReport
from aicf_tvm.driver.pipeline import normalize
from relax_passes import (
    EliminateEmits,
    LiftEmits,
    MaterializeEmits,
    MaterializeLayouts,
    PropagateContracts,
)
from relax_passes.materialize_layouts import channel_block, find_chains, layout_form

from ..conftest import run_vm
from ..helpers import assert_matches_reference, torch_function

TARGET = {"kind": "llvm", "num-cores": 2}


def _const(rng: np.random.Generator, *shape: int) -> relax.Constant:
    return relax.const((rng.standard_normal(shape) * 0.3).astype("float32"))


def residual_net(channels: int = 32, size: int = 32, mean_axes=(2, 3), seed: int = 0) -> tvm.IRModule:
    """conv(3 -> C, stride 2) + bias + relu, max pool, conv + bias + residual + relu,
    depthwise + bias + relu6, 1x1 conv (C -> 24), global mean, flatten: one chain, its
    input plain (3 channels do not block) and one exit (the mean, leaving for the reshape)."""
    rng = np.random.default_rng(seed)
    x = relax.Var("x", relax.TensorType((1, 3, size, size), "float32"))
    c = channels
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, _const(rng, c, 3, 3, 3), strides=2, padding=1))
            y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(y, _const(rng, 1, c, 1, 1)))))
            p = bb.emit(relax.op.nn.max_pool2d(y, 3, 2, 1))
            z = bb.emit(relax.op.nn.conv2d(p, _const(rng, c, c, 3, 3), padding=1))
            z = bb.emit(relax.op.add(z, _const(rng, 1, c, 1, 1)))
            z = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(z, p))))
            d = bb.emit(relax.op.nn.conv2d(z, _const(rng, c, 1, 3, 3), strides=2, padding=(0, 0, 1, 1), groups=c))
            d = bb.emit(relax.op.clip(bb.emit(relax.op.add(d, _const(rng, c, 1, 1))), 0.0, 6.0))
            e = bb.emit(relax.op.nn.conv2d(d, _const(rng, 24, c, 1, 1)))
            m = bb.emit(relax.op.mean(e, list(mean_axes), keepdims=True))
            out = bb.emit_output(relax.op.reshape(m, (1, 24)))
        bb.emit_func_output(out)
    return bb.get()


def special_input(rng: np.random.Generator, shape) -> np.ndarray:
    x = rng.standard_normal(shape).astype("float32")
    x[0, 0, 0, 0], x[0, 1, -1, -1], x[0, 2, 1, 2] = np.nan, np.inf, -np.inf
    return x


def layout_decisions(report: FusionReport) -> list:
    return [d for d in report.decisions if d.candidate == "materialize:layout"]


def transforms(mod: tvm.IRModule) -> list[tuple]:
    """(from, to) of every layout_transform Emit main calls."""
    out = []
    for b in mod["main"].body.blocks[0].bindings:
        v = b.value
        if isinstance(v, relax.Call) and isinstance(v.op, relax.GlobalVar):
            body = [x.value for blk in mod[v.op].body.blocks for x in blk.bindings]
            if len(body) == 1 and transform_layouts(body[0]) is not None:
                out.append(transform_layouts(body[0]))
    return out


def lifted(mod: tvm.IRModule) -> tvm.IRModule:
    return PropagateContracts()(LiftEmits()(normalize(mod)))


def test_chain_is_blocked_with_conversions_at_its_boundary_only():
    """Four convolutions, a pool, pointwise ops and the mean are one chain: its input enters
    plain (the first conv reads NCHW), and only the mean's result is converted back."""
    report = FusionReport()
    after = MaterializeEmits(report=report, lanes=16)(lifted(residual_net()))
    [decision] = layout_decisions(report)
    assert decision.accepted and len(decision.members) == 13
    assert "NCHW8c/NCHW16c" in decision.note and "4 convolutions" in decision.note
    assert "0 entering and 1 leaving" in decision.note and " ms" in decision.note
    assert transforms(after) == [("NCHW8c", None)]


def test_blocked_model_matches_the_unoptimized_build_with_nan_and_inf():
    mod = residual_net()
    compiled = aicf_tvm.compile(mod, target=TARGET)
    assert {k.schedule for k in compiled.kernels if "conv" in k.kind} == {"BlockedConv2d"}
    rng = np.random.default_rng(1)
    specials = special_input(rng, (1, 3, 32, 32))
    for x in (specials, rng.standard_normal((1, 3, 32, 32)).astype("float32")):
        np.testing.assert_allclose(np.asarray(compiled(x)), run_vm(mod, x)[0], rtol=1e-4, atol=1e-4)


def test_mean_over_negative_axes_reduces_the_spatial_axes_of_the_blocked_tensor():
    """``mean(x, [-1, -2])`` names H and W of NCHW; on NCHW16c, -1 is the channel block:
    the blocked mean must reduce axes 2 and 3 (it once reduced W and the block)."""
    mod = residual_net(mean_axes=(-1, -2))
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 3, 32, 32)).astype("float32")
    got = np.asarray(aicf_tvm.compile(mod, target=TARGET)(x))
    np.testing.assert_allclose(got, run_vm(mod, x)[0], rtol=1e-4, atol=1e-4)


def test_layout_step_is_idempotent_and_needs_the_vector_width():
    once = MaterializeEmits(report=FusionReport(), lanes=16)(lifted(residual_net()))
    report = FusionReport()
    again = MaterializeEmits(report=report, lanes=16)(PropagateContracts()(once))
    assert not layout_decisions(report) and transforms(again) == transforms(once)
    plain = MaterializeEmits(report=FusionReport())(lifted(residual_net()))
    assert transforms(plain) == []


def test_layout_pass_alone_does_what_materialize_emits_does_first():
    """MaterializeLayouts is MaterializeEmits' first job as a pass: a block it relays gets
    nothing else that round, so on this net the two give the same module and report."""
    before = lifted(residual_net())
    alone, composed = FusionReport(), FusionReport()
    a = MaterializeLayouts(16, report=alone)(before)
    b = MaterializeEmits(report=composed, lanes=16)(before)
    tvm.ir.assert_structural_equal(a, b)
    assert [str(d) for d in alone.decisions] == [str(d) for d in composed.decisions]


def test_small_chain_whose_conversions_cost_more_is_refused_and_reported():
    """One tiny 1x1 conv between two plain activations: two conversions cost more than
    the conv time saved; the refusal is reported and the module keeps NCHW."""
    rng = np.random.default_rng(3)
    x = relax.Var("x", relax.TensorType((1, 16, 4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(x, _const(rng, 16, 16, 1, 1)))
        bb.emit_func_output(out)
    report = FusionReport()
    after = MaterializeEmits(report=report, lanes=16)(lifted(bb.get()))
    [decision] = layout_decisions(report)
    assert not decision.accepted and "saving <= cost" in decision.note
    assert transforms(after) == []


@pytest.mark.parametrize("channels,blocks", [(32, 16), (24, 8), (12, None)])
def test_channel_block_is_the_vector_width_or_half_of_it(channels, blocks):
    assert channel_block(channels, 16) == blocks


def test_squeeze_excitation_scale_has_a_blocked_form_only_per_sample_and_channel():
    """``y * s`` with ``s`` an activation [N, C, 1, 1] broadcasts the same blocked; an
    activation of another broadcast shape ([N, C, 1, W]) has no blocked form."""
    y = relax.Var("y", relax.TensorType((1, 32, 8, 8), "float32"))
    scale = relax.Var("s", relax.TensorType((1, 32, 1, 1), "float32"))
    row = relax.Var("r", relax.TensorType((1, 32, 1, 8), "float32"))
    assert layout_form(relax.op.multiply(y, scale), y, 16) is not None
    assert layout_form(relax.op.multiply(y, row), y, 16) is None


def test_no_blocked_form_for_a_runtime_weight_or_odd_channels():
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "float32"))
    w = relax.Var("w", relax.TensorType((16, 16, 3, 3), "float32"))
    assert layout_form(relax.op.nn.conv2d(x, w), relax.Var("y", relax.TensorType((1, 16, 6, 6), "float32")), 16) is None
    odd = relax.Var("x", relax.TensorType((1, 12, 8, 8), "float32"))
    y = relax.Var("y", relax.TensorType((1, 12, 8, 8), "float32"))
    assert layout_form(relax.op.nn.relu(odd), y, 16) is None


def test_chain_members_exclude_ops_without_a_blocked_form():
    """A softmax over channels has no blocked form: the conv before it is a chain of its
    own whose value leaves for the softmax."""
    rng = np.random.default_rng(4)
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, _const(rng, 16, 16, 3, 3), padding=1))
            out = bb.emit_output(relax.op.nn.softmax(y, axis=1))
        bb.emit_func_output(out)
    mod = lifted(bb.get())
    [chain] = find_chains(EmitGraph(mod, mod["main"].body.blocks[0]), 16)
    assert len(chain.members) == 1 and len(chain.entries) == 1 and len(chain.exits) == 1


def test_inverse_layout_transform_pair_cancels():
    """NCHW -> NCHW16c -> NCHW is the input: EliminateEmits says so and removes both."""
    x = relax.Var("x", relax.TensorType((1, 32, 4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            b = bb.emit(relax.op.layout_transform(x, index_map=blocking_map(16)))
            u = bb.emit(relax.op.layout_transform(b, index_map=unblocking_map(16)))
            out = bb.emit_output(relax.op.nn.relu(u))
        bb.emit_func_output(out)
    mod = lifted(bb.get())
    report = FusionReport()
    after = EliminateEmits(report=report)(mod)
    assert transforms(after) == []
    assert any("inverse layout_transform pair NCHW -> NCHW16c -> NCHW" in d.note for d in report.decisions)
    rng = np.random.default_rng(5)
    xv = special_input(rng, (1, 32, 4, 4))
    np.testing.assert_array_equal(run_vm(after, xv)[0], run_vm(bb.get(), xv)[0])


def test_concat_along_channels_runs_blocked_with_its_axis_renamed():
    """Two branches concatenated along the channels (axis -3 in NCHW, which is H of the
    blocked tensor): whole blocks are concatenated on axis 1, the result is unchanged."""
    rng = np.random.default_rng(6)
    x = relax.Var("x", relax.TensorType((1, 16, 12, 12), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, _const(rng, 32, 16, 3, 3), padding=1))))
            b = bb.emit(relax.op.nn.conv2d(x, _const(rng, 16, 16, 1, 1)))
            c = bb.emit(relax.op.concat([a, b], axis=-3))
            out = bb.emit_output(relax.op.nn.conv2d(c, _const(rng, 32, 48, 3, 3), padding=1))
        bb.emit_func_output(out)
    mod = bb.get()
    report = FusionReport()
    after = MaterializeEmits(report=report, lanes=16)(lifted(mod))
    [decision] = layout_decisions(report)
    assert decision.accepted and len(decision.members) == 5
    assert transforms(after) == [(None, "NCHW16c"), ("NCHW16c", None)]
    xv = rng.standard_normal((1, 16, 12, 12)).astype("float32")
    np.testing.assert_allclose(np.asarray(aicf_tvm.compile(mod, target=TARGET)(xv)), run_vm(mod, xv)[0],
                               rtol=1e-4, atol=1e-4)


def test_blocked_conv_candidate_requires_the_layout_fact_of_its_data():
    """A blocked conv2d on a parameter (layout ⊤: nothing says it is stored NCHW16c) is not
    fused: the candidate's requirement names the layout; on a blocked value it fuses."""
    rng = np.random.default_rng(7)
    x = relax.Var("x", relax.TensorType((1, 2, 6, 6, 16), "float32"))
    p = relax.Var("p", relax.TensorType((1, 32, 6, 6), "float32"))
    weight = _const(rng, 2, 2, 3, 3, 16, 16)
    bias = _const(rng, 1, 2, 1, 1, 16)
    layouts = {"data_layout": "NCHW16c", "kernel_layout": "OIHW16i16o", "out_layout": "NCHW16c"}
    bb = relax.BlockBuilder()
    with bb.function("main", [x, p]):
        with bb.dataflow():
            raw = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(
                bb.emit(relax.op.nn.conv2d(x, weight, padding=1, **layouts)), bias))))
            moved = bb.emit(relax.op.layout_transform(p, index_map=blocking_map(16)))
            fact = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(
                bb.emit(relax.op.nn.conv2d(moved, weight, padding=1, **layouts)), bias))))
            out = bb.emit_output(relax.Tuple([raw, fact]))
        bb.emit_func_output(out)
    compiled = aicf_tvm.compile(bb.get(), target=TARGET)
    convs = [d for d in compiled.report.decisions if d.candidate == "fused_conv2d_bias_act"]
    refused = [d for d in convs if not d.accepted]
    assert any(d.accepted for d in convs)
    assert refused and any("NCHW16c" in str(f) for d in refused for f in d.failures), refused


def regnet_block(channels: int = 64, width: int = 128, group_width: int = 64, size: int = 16,
                 seed: int = 8) -> tvm.IRModule:
    """RegNet's bottleneck without SE: 1x1 conv (C -> W) + bias + relu, grouped 3x3 conv
    (group width 64) + bias + relu, 1x1 conv (W -> C) + bias, residual add of the input, relu."""
    rng = np.random.default_rng(seed)
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.conv2d(x, _const(rng, width, channels, 1, 1)))
            a = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(a, _const(rng, 1, width, 1, 1)))))
            g = bb.emit(relax.op.nn.conv2d(a, _const(rng, width, group_width, 3, 3), padding=1,
                                           groups=width // group_width))
            g = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(g, _const(rng, 1, width, 1, 1)))))
            c = bb.emit(relax.op.nn.conv2d(g, _const(rng, channels, width, 1, 1)))
            c = bb.emit(relax.op.add(c, _const(rng, 1, channels, 1, 1)))
            out = bb.emit_output(relax.op.nn.relu(bb.emit(relax.op.add(c, x))))
        bb.emit_func_output(out)
    return bb.get()


def test_grouped_convolution_keeps_a_regnet_chain_blocked():
    """The grouped 3x3 (group width 64, a multiple of the block) has a blocked form, so the
    three convolutions and their epilogues are one chain: the input is blocked once, the
    result unblocked once, nothing converted between the convolutions."""
    report = FusionReport()
    after = MaterializeEmits(report=report, lanes=16)(lifted(regnet_block()))
    [decision] = layout_decisions(report)
    assert decision.accepted and "3 convolutions" in decision.note, decision.note
    assert transforms(after) == [(None, "NCHW16c"), ("NCHW16c", None)]


def test_grouped_convolution_whose_group_width_splits_a_block_is_not_blocked():
    """Group width 8 with a block of 16: a block would hold channels of two groups, so the
    grouped conv has no blocked form and ends the chains on either side of it."""
    mod = regnet_block(group_width=8)
    x = relax.Var("y", relax.TensorType((1, 128, 16, 16), "float32"))
    calls = [b.value for b in mod["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]
    [conv] = [c for c in calls if c.op.name == "relax.nn.conv2d" and int(c.attrs.groups) > 1]
    assert layout_form(conv, x, 16) is None
    assert layout_form(conv, x, 8) is not None  # blocks of 8 fit its groups
    report = FusionReport()
    MaterializeEmits(report=report, lanes=16)(lifted(mod))
    assert ["(1 convolutions)" in d.note for d in layout_decisions(report)] == [True, True]


def test_blocked_regnet_chain_matches_the_unoptimized_build():
    mod = regnet_block()
    compiled = aicf_tvm.compile(mod, target=TARGET)
    assert {k.schedule for k in compiled.kernels if "conv" in k.kind} == {"BlockedConv2d"}
    rng = np.random.default_rng(9)
    xs = [special_input(rng, (1, 64, 16, 16)), rng.standard_normal((1, 64, 16, 16)).astype("float32"),
          rng.standard_normal((1, 64, 16, 16)).astype("float32")]
    outs = [np.asarray(compiled(x)) for x in xs]
    assert not np.allclose(outs[1], outs[2])
    for x, got in zip(xs, outs):
        np.testing.assert_allclose(got, run_vm(mod, x)[0], rtol=1e-4, atol=1e-4)


def regnet_y(seed: int = 10):
    """A stem and two RegNet-Y blocks (1x1, grouped 3x3 of group width 32 and 16, SE, 1x1,
    projection or identity shortcut) in eval mode, batch-norm statistics drawn at random
    so no block normalizes to a constant."""
    import torch
    from torch import nn

    def conv_bn(c: int, o: int, k: int, stride: int = 1, groups: int = 1, act: bool = True) -> nn.Sequential:
        layers = [nn.Conv2d(c, o, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(o)]
        return nn.Sequential(*layers, *([nn.ReLU()] if act else []))

    class Block(nn.Module):
        def __init__(self, c: int, o: int, stride: int, group_width: int) -> None:
            super().__init__()
            self.a = conv_bn(c, o, 1)
            self.b = conv_bn(o, o, 3, stride, o // group_width)
            self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(o, c // 4, 1), nn.ReLU(),
                                    nn.Conv2d(c // 4, o, 1), nn.Sigmoid())
            self.c = conv_bn(o, o, 1, act=False)
            self.short = conv_bn(c, o, 1, stride, act=False) if stride > 1 or c != o else nn.Identity()

        def forward(self, x):
            y = self.b(self.a(x))
            return torch.relu(self.c(y * self.se(y)) + self.short(x))

    torch.manual_seed(seed)
    model = nn.Sequential(conv_bn(3, 32, 3, 2), Block(32, 64, 2, 32), Block(64, 64, 1, 16)).eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    return model


def test_regnet_y_blocks_from_torch_match_pytorch_with_grouped_convolutions_blocked():
    import torch

    model = regnet_y()
    x = torch.randn(1, 3, 32, 32)
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(model, [x]), target=TARGET)
    [decision] = layout_decisions(compiled.report)
    assert decision.accepted and "(12 convolutions)" in decision.note, decision.note
    assert "0 entering and 1 leaving" in decision.note  # the SE scales stay in the chain too
    assert {k.schedule for k in compiled.kernels if "conv" in k.kind} == {"BlockedConv2d"}
    rng = np.random.default_rng(11)
    inputs = [[x.numpy()]] + [[rng.standard_normal((1, 3, 32, 32)).astype("float32")] for _ in range(2)]
    assert_matches_reference(compiled, torch_function(model), inputs, rtol=1e-4, atol=1e-4)
