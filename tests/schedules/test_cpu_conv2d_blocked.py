"""Tests for the blocked-layout conv2d: its legalization (relax_passes/blocked_conv.py) and
its CPU schedule rule (schedules/cpu/conv2d_blocked.py).

Fused groups (blocked conv2d + bias [1, C/b, 1, 1, b] + ReLU or ReLU6, optionally a
residual add) are built from Relax on blocked operands, legalized with our map, scheduled
with ``BlockedConv2d``, run on the host CPU and compared with PyTorch's NCHW convolution
in float64 on the same values (blocked afterwards). Widths 7, 9, 14, 56 exercise one- and
several-tile rows; stride, dilation, asymmetric padding, blocks of 8 and 16, a plain NCHW
input, depthwise kernels (split by planes and by rows) and grouped kernels (group
widths 16, 32 and 64, register tiles within one group) are each covered, as are tasks
by output row (an input over the cache share) and by channel tile and row.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from tvm import relax, s_tir

from relax_passes.legalize_blocked_conv import LEGALIZE_MAP, is_blocked_form
from relax_passes.materialize_layouts import blocked_per_channel, blocked_weight
from schedules import default_rules, schedule_func
from schedules.cpu.common import float32_lanes, vector_registers
from schedules.cpu.conv2d_blocked import (
    BlockedConv2d,
    ConvPlan,
    blocked_conv_block,
    dense_plan,
    dense_plans,
    depthwise_plans,
    register_tile,
    schedule_dense,
    schedule_depthwise,
)
from schedules.cpu.gemm_blocks import find_reduction_block
from schedules.tuning.space import space_count
from tests.schedules.test_cpu_gemm import fused_primfunc, run_scheduled, target

__all__ = ["target"]


def block(a: np.ndarray, b: int) -> np.ndarray:
    """NCHW -> NCHW{b}c."""
    n, c, h, w = a.shape
    return np.ascontiguousarray(a.reshape(n, c // b, b, h, w).transpose(0, 1, 3, 4, 2))


def blocked_primfunc(build, shapes: dict) -> tvm.tirx.PrimFunc:
    """The one reduction PrimFunc of ``build``, the blocked conv legalized by our map."""
    params = [relax.Var(name, relax.TensorType(shape, "float32")) for name, shape in shapes.items()]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(bb, *params))
        bb.emit_func_output(out)
    mod = bb.get()
    for t in (relax.transform.LegalizeOps(LEGALIZE_MAP), relax.transform.AnnotateTIROpPattern(),
              relax.transform.FuseOps(), relax.transform.FuseTIR()):
        mod = t(mod)
    funcs = [f for f in mod.functions.values()
             if isinstance(f, tvm.tirx.PrimFunc) and find_reduction_block(s_tir.Schedule(f)) is not None]
    assert len(funcs) == 1
    return funcs[0]


def blocked_case(c, h, o, k, stride=1, padding=0, dilation=1, depthwise=False, ib=16, ob=16,
                 residual=False, relu6=False, seed=0, w=None, groups=1):
    """(PrimFunc, blocked inputs, blocked expected) for act(conv(x, w) + b [+ r])."""
    rng = np.random.default_rng(seed)
    wd = w or h
    groups = c if depthwise else groups
    x = rng.standard_normal((1, c, h, wd)).astype("float32")
    weight = rng.standard_normal((o, c // groups, k, k)).astype("float32")
    bias = rng.standard_normal((1, o, 1, 1)).astype("float32")
    pad4 = padding if isinstance(padding, tuple) else (padding,) * 4
    xt = torch.nn.functional.pad(torch.from_numpy(x).double(), (pad4[1], pad4[3], pad4[0], pad4[2]))
    ref = torch.nn.functional.conv2d(xt, torch.from_numpy(weight).double(), stride=stride, dilation=dilation,
                                     groups=groups).numpy() + bias
    r = rng.standard_normal(ref.shape).astype("float32")
    if residual:
        ref = ref + r
    ref = np.clip(ref, 0, 6) if relu6 else np.maximum(ref, 0)
    arrays = [block(x, ib) if ib else x, blocked_weight(weight, 1 if depthwise or not ib else ib, ob),
              blocked_per_channel(bias, ob)] + ([block(r, ob)] if residual else [])
    data_layout = f"NCHW{ib}c" if ib else "NCHW"
    kernel_layout = f"OIHW{1 if depthwise or not ib else ib}i{ob}o"

    def build(bb, xv, wv, bv, *rest):
        y = bb.emit(relax.op.nn.conv2d(xv, wv, strides=stride, padding=pad4, dilation=dilation, groups=groups,
                                       data_layout=data_layout, kernel_layout=kernel_layout,
                                       out_layout=f"NCHW{ob}c"))
        y = bb.emit(relax.op.add(y, bv))
        if rest:
            y = bb.emit(relax.op.add(y, rest[0]))
        return relax.op.clip(y, 0.0, 6.0) if relu6 else relax.op.nn.relu(y)

    names = ["x", "w", "b", "r"]
    func = blocked_primfunc(build, {n: a.shape for n, a in zip(names, arrays)})
    return func, dict(zip(names, arrays)), block(ref.astype("float32"), ob)


CASES = {
    "3x3-56": {"c": 32, "h": 56, "o": 32, "k": 3, "padding": 1},
    "3x3-stride2-asymmetric": {"c": 16, "h": 15, "o": 32, "k": 3, "stride": 2, "padding": (0, 0, 1, 1)},
    "3x3-dilation2-7x9": {"c": 16, "h": 7, "w": 9, "o": 16, "k": 3, "padding": 2, "dilation": 2},
    "1x1-residual-relu6": {"c": 32, "h": 14, "o": 64, "k": 1, "residual": True, "relu6": True},
    "1x1-stride2": {"c": 16, "h": 14, "o": 32, "k": 1, "stride": 2},
    "1x1-blocks-16-to-8": {"c": 32, "h": 9, "o": 24, "k": 1, "ob": 8, "residual": True},
    "1x1-blocks-8-to-16": {"c": 24, "h": 9, "o": 32, "k": 1, "ib": 8},
    "plain-input-7x7-stride2": {"c": 3, "h": 30, "o": 16, "k": 7, "stride": 2, "padding": 3, "ib": 0},
    "depthwise-3x3-few-planes": {"c": 16, "h": 28, "o": 16, "k": 3, "padding": 1, "depthwise": True, "relu6": True},
    "depthwise-stride2-many-planes": {"c": 160, "h": 14, "o": 160, "k": 3, "stride": 2, "padding": (0, 0, 1, 1),
                                      "depthwise": True},
    "depthwise-7x7-block8-residual": {"c": 24, "h": 14, "o": 24, "k": 7, "padding": 3, "depthwise": True,
                                      "ib": 8, "ob": 8, "residual": True},
    # grouped: group widths 64 (RegNet), 32 and 16 (one block per group, tiles of one block)
    "grouped-width64-3x3": {"c": 128, "h": 14, "o": 128, "k": 3, "padding": 1, "groups": 2},
    "grouped-width64-3x3-stride2-residual": {"c": 192, "h": 15, "o": 192, "k": 3, "stride": 2, "padding": 1,
                                             "groups": 3, "residual": True},
    "grouped-width32-1x1-relu6": {"c": 64, "h": 9, "o": 96, "k": 1, "groups": 2, "relu6": True},
    "grouped-width16-3x3-stride2": {"c": 64, "h": 14, "o": 64, "k": 3, "stride": 2, "padding": (0, 0, 1, 1),
                                    "groups": 4},
    "grouped-width16-1x1-stride2": {"c": 64, "h": 14, "o": 32, "k": 1, "stride": 2, "groups": 2},
    "grouped-blocks-8-to-16-dilation2": {"c": 48, "h": 9, "o": 96, "k": 3, "padding": 2, "dilation": 2,
                                         "groups": 3, "ib": 8},
    # inputs over the cache share, weights within it: tasks by output row
    "rows-1x1-stride2-residual": {"c": 256, "h": 56, "o": 64, "k": 1, "stride": 2, "residual": True},
    "rows-3x3-odd-width-45": {"c": 128, "h": 45, "o": 64, "k": 3, "padding": 1},
    # a prime width: the columns cannot divide it, the last tile is partial
    "3x3-prime-width-19": {"c": 32, "h": 19, "o": 32, "k": 3, "padding": 1},
    "3x3-one-row-199-columns": {"c": 32, "h": 1, "w": 201, "o": 32, "k": 3, "padding": (1, 0, 1, 0)},
    # too few rows to balance the cores: tasks by channel tile and row
    "wide-input-7x7-output": {"c": 2048, "h": 14, "o": 64, "k": 1, "stride": 2},
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_blocked_conv_matches_torch(target, case):
    func, arrays, expected = blocked_case(**case)
    sch = BlockedConv2d().apply(func, target, False)
    assert sch is not None, "the rule declined a blocked conv2d"
    got = run_scheduled(sch, target, arrays, expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.sqrt(expected.size))


def _avx2_target() -> tvm.target.Target:
    """An AVX2 CPU (16 registers) for this host's triple; AVX-512 hosts run its code too."""
    host = tvm.target.Target.from_device(tvm.cpu())
    if not tvm.target.codegen.llvm_cpu_has_features("avx2", host):
        pytest.skip("the host cannot run AVX2 code")
    config = {k: v for k, v in host.export().items() if k in ("kind", "mtriple")}
    return tvm.target.Target({**config, "mcpu": "haswell", "num-cores": 2})


@pytest.mark.parametrize("name", ["3x3-56", "3x3-dilation2-7x9", "1x1-residual-relu6", "1x1-blocks-8-to-16",
                                  "depthwise-7x7-block8-residual", "grouped-width64-3x3-stride2-residual",
                                  "rows-3x3-odd-width-45"])
def test_avx2_tiles_whose_columns_leave_a_partial_tile_match_torch(name):
    """With 16 registers the tile's columns need not divide the output width: the default
    plan and the first plan whose last tile is partial (split off by LoopPartition) both
    match torch."""
    func, arrays, expected = blocked_case(**CASES[name])
    target = _avx2_target()
    sch = s_tir.Schedule(func)
    main, depthwise = blocked_conv_block(sch)
    plans = (depthwise_plans if depthwise else dense_plans)(sch, main, target)
    width = int(sch.get(main).iter_vars[3].dom.extent)
    partial = next(plan for plan in plans if width % plan.columns)
    for plan in (plans[0], partial):
        space = sch.copy()
        (schedule_depthwise if depthwise else schedule_dense)(space, main, target, plan)
        got = run_scheduled(space, target, arrays, expected.shape)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.sqrt(expected.size),
                                   err_msg=plan.label())


@pytest.mark.parametrize(("case", "rows", "by_rows"), [
    ({"c": 256, "h": 56, "o": 64, "k": 1, "stride": 2}, 28, True),  # 3 MB input, 64 KB weights
    ({"c": 64, "h": 28, "o": 128, "k": 1}, 28, False),  # 200 KB input: channel tiles x rows
    ({"c": 2048, "h": 14, "o": 64, "k": 1, "stride": 2}, 7, False),  # 7 rows cannot feed 2 cores x 4
])
def test_dense_tasks_go_by_row_when_the_input_overflows_the_cache(target, case, rows, by_rows):
    """By (channel tile, row) every tile re-reads the whole input; when that overflows
    the cache and the weights do not, a task is one row running every tile."""
    func, _, _ = blocked_case(**case)
    plan_sch = s_tir.Schedule(func)
    main, _ = blocked_conv_block(plan_sch)
    plan = dense_plan(plan_sch, main, target)
    assert plan.by_rows == by_rows
    sch = BlockedConv2d().apply(func, target, False)
    outer = sch.get_loops(sch.get_sblock("conv2d_nchwc_update"))[0]
    assert sch.get(outer).kind == tvm.tirx.ForKind.PARALLEL
    tiles = int(plan_sch.get(main).iter_vars[1].dom.extent) // plan.channel_blocks
    assert int(sch.get(outer).extent) == (rows if by_rows else tiles * rows)


@pytest.mark.parametrize(("case", "tasks"), [
    ({"c": 144, "h": 56, "o": 144, "k": 3, "padding": 1}, 18),  # 9 planes, 2 row blocks each
    ({"c": 32, "h": 112, "o": 32, "k": 3, "padding": 1}, 8),  # 2 planes, 4 row blocks each
    ({"c": 384, "h": 14, "o": 384, "k": 3, "padding": 1}, 24),  # whole planes
])
def test_depthwise_tasks_are_row_blocks_split_evenly_over_the_cores(target, case, tasks):
    """Each task pads the rows it reads once (a task per output row copied every input row
    three times) and the static split gives each core the same share."""
    func, arrays, expected = blocked_case(**case, depthwise=True, relu6=True)
    sch = BlockedConv2d().apply(func, target, False)
    outer = sch.get_loops(sch.get_sblock("conv2d_nchwc_update"))[0]
    assert sch.get(outer).kind == tvm.tirx.ForKind.PARALLEL
    assert int(sch.get(outer).extent) == tasks
    got = run_scheduled(sch, target, arrays, expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.sqrt(expected.size))


@pytest.mark.parametrize("name", ["3x3-dilation2-7x9", "1x1-residual-relu6", "1x1-blocks-16-to-8",
                                  "plain-input-7x7-stride2", "depthwise-7x7-block8-residual",
                                  "grouped-width64-3x3-stride2-residual", "rows-1x1-stride2-residual"])
def test_tuning_spaces_are_the_default_then_its_neighbours_each_matching_torch(target, name):
    """``tunable=True`` gives one complete schedule per plan, the default's first and
    every one distinct, none sampling anything (tuning measures each as it is); each
    computes the convolution, to the default's bits (every plan reduces in one order)."""
    func, arrays, expected = blocked_case(**CASES[name])
    spaces = BlockedConv2d().apply(func, target, True)
    default = BlockedConv2d().apply(func, target, False)
    assert isinstance(spaces, list) and len(spaces) > 1
    tvm.ir.assert_structural_equal(spaces[0].mod, default.mod)
    assert len({str(s.trace) for s in spaces}) == len(spaces)
    assert space_count(spaces) == len(spaces) - 1
    first = run_scheduled(default, target, arrays, expected.shape)
    np.testing.assert_allclose(first, expected, rtol=1e-4, atol=1e-4 * np.sqrt(expected.size))
    for sch in spaces[1:]:
        np.testing.assert_array_equal(run_scheduled(sch, target, arrays, expected.shape), first)


def test_dense_plans_hold_only_tiles_that_fit_the_registers_and_the_group(target):
    """Tiles of 1, 2 or 4 blocks dividing the group's blocks, with the accumulators and a
    weight vector per block within the registers the broadcasts leave; both task orders."""
    func, _, _ = blocked_case(**CASES["grouped-width32-1x1-relu6"])  # 2 blocks per group, width 9
    sch = s_tir.Schedule(func)
    main, _ = blocked_conv_block(sch)
    plans = dense_plans(sch, main, target)
    assert all(isinstance(p, ConvPlan) for p in plans)
    assert {p.channel_blocks for p in plans} <= {1, 2}
    registers = vector_registers(target)
    tile = registers - (2 if registers >= 32 else 4)  # the registers the broadcasts leave
    per_block = 16 // float32_lanes(target)  # vectors per 16-channel block
    assert all(p.channel_blocks * per_block * (p.columns + 1) <= tile for p in plans)
    assert {p.by_rows for p in plans} == {False, True}
    assert all(9 % p.columns == 0 or p.columns == min(9, tile // (p.channel_blocks * per_block) - 1)
               for p in plans)


def test_default_rules_give_blocked_convolutions_the_direct_schedule(target):
    func, _, _ = blocked_case(**CASES["3x3-56"])
    scheduled = schedule_func(func, target, default_rules(target))
    assert scheduled is not None and scheduled.attrs["aicf.schedule"] == "BlockedConv2d"


def test_returns_none_for_an_nchw_convolution(target):
    func = fused_primfunc(lambda bb, x, w: relax.op.nn.conv2d(x, w, padding=1), {"x": (1, 4, 9, 9), "w": (8, 4, 3, 3)})
    assert BlockedConv2d().apply(func, target, False) is None


def test_returns_none_for_a_matmul(target):
    func = fused_primfunc(lambda bb, x, w: relax.op.matmul(x, w), {"x": (8, 16), "w": (16, 4)})
    assert BlockedConv2d().apply(func, target, False) is None


def test_register_tile_fits_the_accumulators():
    """Two channel blocks of one vector each by 14 columns: 28 accumulators; a width with
    no divisor under the limit but itself (13) takes one column per step only if needed."""
    assert register_tile(blocks=4, width=56, vectors_per_block=1) == (2, 14)
    assert register_tile(blocks=3, width=7, vectors_per_block=1) == (1, 7)
    assert register_tile(blocks=2, width=13, vectors_per_block=1) == (2, 13)
    assert register_tile(blocks=2, width=13, vectors_per_block=2) == (1, 13)
    # a width whose divisors make tiles under half the accumulators of a partial tile's
    # (199 prime, 799 = 17 x 47, ResNet-50's 38 and 19 at 299 px) takes a partial last tile,
    # of at most 16 accumulators: 1x14, not 2x14; 7 and 49 keep 2x7
    assert register_tile(blocks=32, width=199, vectors_per_block=1) == (1, 14)
    assert register_tile(blocks=32, width=799, vectors_per_block=1) == (1, 14)
    assert register_tile(blocks=8, width=38, vectors_per_block=1) == (1, 14)
    assert register_tile(blocks=16, width=19, vectors_per_block=1) == (1, 14)
    assert register_tile(blocks=32, width=49, vectors_per_block=1) == (2, 7)
    assert register_tile(blocks=32, width=7, vectors_per_block=1) == (2, 7)
    # AVX2: 12 registers for the accumulators and the weights (4x3 would leave the weights
    # none); the columns divide the width unless that halves the widest that fits
    assert register_tile(blocks=8, width=56, vectors_per_block=1, registers=16) == (2, 4)
    assert register_tile(blocks=8, width=14, vectors_per_block=1, registers=16) == (2, 5)
    assert register_tile(blocks=2, width=7, vectors_per_block=1, registers=16) == (2, 5)
    assert register_tile(blocks=3, width=7, vectors_per_block=1, registers=16) == (1, 7)
    assert register_tile(blocks=1, width=56, vectors_per_block=1, registers=16) == (1, 8)


def test_register_tile_forms_of_the_options():
    """``CompileOptions.conv_register_tile``: the earlier forms the A/B script measures
    against. At width 199 "partial" takes the 2 x 14 tile of the most FMAs, "dividing"
    a column per step; at 49 all three agree."""
    assert [register_tile(32, 199, 1, 32, form) for form in ("held", "partial", "dividing")] == [
        (1, 14), (2, 14), (4, 1)]
    assert {register_tile(32, 49, 1, 32, form) for form in ("held", "partial", "dividing")} == {(2, 7)}


def test_only_the_three_blocked_forms_are_ours():
    """Dense, grouped with whole blocks per group, depthwise; mismatched blocks, a kernel
    whose I is not one group's channels, groups that split a block and plain layouts go to
    TVM's own legalization (which refuses blocked layouts)."""
    assert is_blocked_form([1, 2, 8, 8, 16], [4, 2, 3, 3, 16, 16], 1, "NCHW16c", "OIHW16i16o", "NCHW16c")
    assert is_blocked_form([1, 2, 8, 8, 16], [2, 1, 3, 3, 1, 16], 32, "NCHW16c", "OIHW1i16o", "NCHW16c")
    assert is_blocked_form([1, 3, 8, 8], [4, 3, 3, 3, 1, 16], 1, "NCHW", "OIHW1i16o", "NCHW16c")
    assert is_blocked_form([1, 2, 8, 8, 16], [4, 1, 3, 3, 16, 16], 2, "NCHW16c", "OIHW16i16o", "NCHW16c")
    assert is_blocked_form([1, 6, 8, 8, 8], [6, 2, 3, 3, 8, 16], 3, "NCHW8c", "OIHW8i16o", "NCHW16c")
    assert not is_blocked_form([1, 2, 8, 8, 16], [4, 2, 3, 3, 16, 16], 2, "NCHW16c", "OIHW16i16o", "NCHW16c")
    assert not is_blocked_form([1, 2, 8, 8, 16], [3, 1, 3, 3, 16, 16], 2, "NCHW16c", "OIHW16i16o", "NCHW16c")
    assert not is_blocked_form([1, 3, 8, 8, 16], [4, 1, 3, 3, 16, 16], 2, "NCHW16c", "OIHW16i16o", "NCHW16c")
    assert not is_blocked_form([1, 4, 8, 8, 16], [4, 1, 3, 3, 16, 16], 8, "NCHW16c", "OIHW16i16o", "NCHW16c")
    assert not is_blocked_form([1, 2, 8, 8, 16], [4, 2, 3, 3, 8, 16], 1, "NCHW16c", "OIHW8i16o", "NCHW16c")
    assert not is_blocked_form([1, 3, 8, 8], [4, 3, 3, 3], 1, "NCHW", "OIHW", "NCHW")


def test_a_grouped_convolution_with_a_symbolic_batch_takes_tvms_legalization():
    """A symbolic dim is never blocked, so legalization must not need every dim static (it
    called ``int()`` on the batch var). Checked end to end against torch."""
    import aicf_tvm

    n = tvm.tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, 3, 4, 2), "float32"))
    w = relax.Var("w", relax.TensorType((3, 1, 1, 1), "float32"))
    with bb.function("main", [x, w]):
        out = bb.emit(relax.op.nn.conv2d(x, w, padding=1, groups=3))
        bb.emit_func_output(out)
    compiled = aicf_tvm.compile(bb.get(), target="llvm")
    rng = np.random.default_rng(3)
    data = rng.standard_normal((2, 3, 4, 2)).astype("float32")
    weight = rng.standard_normal((3, 1, 1, 1)).astype("float32")
    expected = torch.nn.functional.conv2d(torch.from_numpy(data), torch.from_numpy(weight), padding=1, groups=3)
    got = compiled(data, weight)
    np.testing.assert_allclose(np.asarray(got.numpy() if hasattr(got, "numpy") else got), expected.numpy(),
                               rtol=1e-5, atol=1e-6)


def test_dense_convolution_sums_channel_blocks_from_zero():
    """A 3x3 convolution over 256 channels: each output sums nine taps of 2^24 (the first
    channel) and 2295 ones (the others: a relative 1.5e-5 of the sum).  One serial float32
    sum loses every 1; summed in blocks of channels from zero (``SUM_BLOCK_TERMS``) only the
    first block's are lost.  Against
    numpy's float64 sum; ``blocked_sums=False`` builds the serial form."""
    import aicf_tvm

    conv = torch.nn.Conv2d(256, 16, 3, bias=True).eval()
    with torch.no_grad():
        conv.weight.fill_(1.0)
        conv.weight[8:] = 2.0  # output channels 8.. weigh every term twice (exact)
        conv.bias.zero_()
    x = np.ones((1, 256, 6, 6), "float32")
    x[0, :, :, 3:] = 0.5  # columns differ: sums differ
    x[0, 0] = np.float32(2.0**24)
    want = torch.nn.functional.conv2d(torch.from_numpy(x).double(), conv.weight.detach().double()).numpy()
    mod = aicf_tvm.from_torch(conv, (torch.from_numpy(x),))
    errors = []
    for blocked in (False, True):
        options = aicf_tvm.CompileOptions(blocked_sums=blocked)
        got = np.asarray(aicf_tvm.compile(mod, target="llvm", options=options, cache=False)(x))
        errors.append((np.abs(got - want) / np.abs(want)).max())
    serial, blocked = errors
    assert serial > 1e-5  # most of the ones lost
    assert blocked < serial / 4
