"""Our rules as MetaSchedule design spaces (schedules/tune_space.py, gemm.gemm_spaces).

A design space is a trace MetaSchedule replays with new decisions, so each one is checked
the way MetaSchedule uses it: with the default plan's decisions and re-sampled at random,
built and compared with numpy.  No tuning run here (tests/aicf_tvm/driver/tuning/test_run.py has one).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir, tirx
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

from schedules.cpu import Conv2d, Gemm
from schedules.cpu.common import float32_lanes, gemm_tiles_by_area, vector_registers
from schedules.cpu.gemm_plan import plan_gemm
from schedules.tuning.space import design_spaces, has_unplain_rewrite, space_generator, timed_form
from tests.schedules.test_cpu_conv2d import CASES, conv_case
from tests.schedules.test_cpu_gemm import fused_primfunc, random_inputs, run_scheduled, target

__all__ = ["target"]  # the pytest fixture, shared with the GEMM tests


def linear(m: int, n: int, k: int, layout_free: bool = False) -> tuple[tvm.tirx.PrimFunc, dict, np.ndarray]:
    """(PrimFunc, inputs, expected) of relu(x @ w + b); ``layout_free``: w is a constant
    (``mark_layout_free``'s attr), so the rule marks its packing for compile time."""
    shapes = {"x": (m, k), "w": (k, n), "b": (n,)}

    def build(bb, x, w, b):
        return relax.op.nn.relu(bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, w)), b)))

    func = fused_primfunc(build, shapes)
    if layout_free:
        func = func.with_attr("layout_free_buffers", [tirx.IntImm("int64", 1)])
    a = random_inputs(shapes)
    return func.with_attr("global_symbol", "main"), a, np.maximum(a["x"] @ a["w"] + a["b"], 0)


def decisions(sch: s_tir.Schedule) -> list[list[int]]:
    return [[int(v) for v in sch.trace.decisions[inst]] for inst in sch.trace.insts
            if inst.kind.name == "SamplePerfectTile"]


def resampled(space: s_tir.Schedule, func: tvm.tirx.PrimFunc, seed: int) -> s_tir.Schedule:
    """The space's trace replayed with fresh random decisions, as MetaSchedule samples it."""
    sch = s_tir.Schedule(func, seed=seed)
    s_tir.Trace(space.trace.insts, {}).apply_to_schedule(sch, remove_postproc=True)
    return sch


def assert_computes(sch: s_tir.Schedule, target, arrays: dict, expected: np.ndarray) -> None:
    got = run_scheduled(sch, target, arrays, expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * math.sqrt(expected.size))


def test_first_space_holds_the_default_plan_as_its_decisions(target):
    """M, N and K blocks are sampled with the rule's own plan as the decision: the search
    starts on the default kernel, and the rule's untuned schedule samples nothing."""
    func, _, _ = linear(128, 768, 3072)
    spaces = Gemm().apply(func, target, True)
    plan = plan_gemm(1, 128, 768, 3072, lanes=float32_lanes(target), cores=2,
                     registers=vector_registers(target), tile_by_area=gemm_tiles_by_area(target))
    assert decisions(spaces[0]) == [[128 // plan.mc, plan.mc // plan.mr], [768 // plan.nc, plan.nc // plan.nr],
                                    [3072 // plan.kc, plan.kc]]
    assert len(spaces) > 4
    assert not decisions(Gemm().apply(func, target, False))


def test_every_space_computes_the_gemm_with_any_decisions(target):
    """Odd extents pad M and N per space's own tile: every space with its plan's decisions
    matches numpy, and so do spaces re-sampled at random (K = 401 padded too)."""
    func, arrays, expected = linear(7, 33, 65)
    for space in Gemm().apply(func, target, True):
        assert_computes(space, target, arrays, expected)
    func, arrays, expected = linear(20, 48, 401)
    for seed, space in enumerate(Gemm().apply(func, target, True)[::4], 1):
        assert_computes(resampled(space, func, seed), target, arrays, expected)


def test_conv2d_spaces_compute_the_convolution(target):
    func, arrays, expected = conv_case(**CASES["3x3-stride2-pad1"])
    spaces = Conv2d().apply(func, target, True)
    assert len(spaces) > 1
    for seed, space in enumerate(spaces[:3], 1):
        assert_computes(space, target, arrays, expected)
        assert_computes(resampled(space, func, seed), target, arrays, expected)


def test_design_spaces_come_from_the_rule_that_schedules_the_workload(target):
    """A GEMM gets our rule's spaces; a reduction our tunable rules decline gets none, so
    MetaSchedule searches its own space."""
    func, _, _ = linear(16, 32, 32)
    spaces = design_spaces(tvm.IRModule({"main": func}), target)
    assert spaces and decisions(spaces[0])
    total = fused_primfunc(lambda bb, x: relax.op.sum(x, axis=1), {"x": (8, 32)}).with_attr("global_symbol", "main")
    assert design_spaces(tvm.IRModule({"main": total}), target) is None
    generator = space_generator(spaces)
    assert [str(s.trace) for s in generator.generate_design_space(tvm.IRModule({"main": func}))] == [
        str(s.trace) for s in spaces]


def test_spaces_mark_only_packings_metaschedule_can_time(target):
    """K = 401 pads B's packing (an ``if_then_else``): the default rule still marks it for
    compile-time packing, which TVM's RemoveWeightLayoutRewriteBlock (MetaSchedule's timing
    of every candidate) cannot take out; no design space marks such a packing."""
    func, _, _ = linear(64, 2000, 401, layout_free=True)
    default = Gemm().apply(func, target, False)
    assert has_unplain_rewrite(default.mod)
    with pytest.raises(Exception):  # noqa: B017 - TVM's check fails with its own error type
        RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(default.mod)
    for space in Gemm().apply(func, target, True):
        assert not has_unplain_rewrite(space.mod)
        RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(space.mod)


def test_timed_form_times_a_padded_packing_as_prepacked(target):
    """The default's padded packing, timed: the kernel takes the packed weight, as the one
    ``compile`` builds does after prepacking it; the schedule itself is left alone."""
    func, _, _ = linear(64, 2000, 401, layout_free=True)
    mod = Gemm().apply(func, target, False).mod
    before = mod.script()
    timed = timed_form(mod)
    assert not has_unplain_rewrite(timed) and mod.script() == before
    shapes = [tuple(int(d) for d in a.shape) for a in ms.arg_info.ArgInfo.from_entry_func(timed, remove_preproc=True)]
    assert shapes[1] != (401, 2000) and math.prod(shapes[1]) >= 401 * 2000  # the packed, padded weight
    plain, _, _ = linear(16, 32, 32, layout_free=True)
    plain_mod = Gemm().apply(plain, target, False).mod
    assert timed_form(plain_mod) is plain_mod
