"""The rule lists per target and the ApplyDefaultSchedules module pass."""

import subprocess
import sys

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir, tirx
from tvm.relax.backend.cpu_generic import pipeline as cpu_pipeline
from tvm.script import relax as R
from tvm.target import Target

import schedules
from schedules import apply_default_schedules, default_rules, is_scheduled, schedule_func
from schedules import cpu as cpu_rules

TARGET = Target({**Target.from_device(tvm.cpu()).export(), "num-cores": 2})
CUDA = Target({"kind": "cuda", "arch": "sm_90"})


SHAPES = {"x": (1, 4, 16, 16), "w": (8, 4, 3, 3), "d": (8, 32), "g": (32,)}


def small_model() -> tvm.IRModule:
    """conv-relu-pool, global pool, dense, softmax, layer norm: one PrimFunc per kind."""
    bb = relax.BlockBuilder()
    x, w, d, g = (relax.Var(n, R.Tensor(s, "float32")) for n, s in SHAPES.items())
    with bb.function("main", [x, w, d, g]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=1)))
            y = bb.emit(relax.op.nn.max_pool2d(y, (2, 2), (2, 2)))
            y = bb.emit(relax.op.nn.adaptive_avg_pool2d(y, (1, 1)))
            y = bb.emit(relax.op.reshape(y, (1, 8)))
            y = bb.emit(relax.op.nn.softmax(relax.op.matmul(y, d)))
            out = bb.emit_output(relax.op.nn.layer_norm(y, g, g, axes=[-1]))
        bb.emit_func_output(out)
    return bb.get()


def build(mod: tvm.IRModule, schedule: bool) -> relax.VMExecutable:
    """The CPU backend's pipeline, with our pass between legalization and lowering."""
    passes = [
        *cpu_pipeline.library_dispatch_passes(TARGET),
        *cpu_pipeline.legalize_passes(TARGET),
        *([apply_default_schedules()] if schedule else []),
        *cpu_pipeline.dataflow_lower_passes(TARGET),
        *cpu_pipeline.finalize_passes(TARGET),
    ]
    with TARGET:
        lowered = tvm.transform.Sequential(passes)(mod)
    return tvm.compile(lowered, target=TARGET)


def prim_funcs(mod: tvm.IRModule) -> dict[str, tirx.PrimFunc]:
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}


def legalized(mod: tvm.IRModule) -> tvm.IRModule:
    return tvm.transform.Sequential(cpu_pipeline.legalize_passes(TARGET))(mod)


def test_scheduled_model_matches_unscheduled_build():
    rng = np.random.default_rng(0)
    mod = small_model()
    inputs = [rng.standard_normal(shape).astype("float32") for shape in SHAPES.values()]
    outputs = []
    for schedule in (False, True):
        vm = relax.VirtualMachine(build(mod, schedule), tvm.cpu())
        outputs.append(vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy())
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)


def test_every_primfunc_is_marked_scheduled():
    with TARGET:
        mod = apply_default_schedules()(legalized(small_model()))
    assert all(is_scheduled(f) for f in prim_funcs(mod).values())


def test_explicit_target_needs_no_scope():
    mod = apply_default_schedules(TARGET)(legalized(small_model()))
    assert all(is_scheduled(f) for f in prim_funcs(mod).values())


def test_missing_target_is_reported():
    with pytest.raises(ValueError, match="target"):
        apply_default_schedules()(legalized(small_model()))


def test_skips_already_scheduled_primfuncs():
    mod = legalized(small_model())
    name, func = next(iter(prim_funcs(mod).items()))
    marked = func.with_attr("tirx.is_scheduled", True)
    mod[name] = marked
    after = apply_default_schedules(TARGET)(mod)
    assert after[name].same_as(marked)


def test_is_idempotent():
    once = apply_default_schedules(TARGET)(legalized(small_model()))
    twice = apply_default_schedules(TARGET)(once)
    tvm.ir.assert_structural_equal(once, twice)


def test_cpu_rule_order():
    names = [type(rule).__name__ for rule in default_rules(TARGET)]
    # a whole-tensor min/max before Reduction, which takes no single-row reduction
    assert names[-5:] == ["BlockedNorm", "FullMinMax", "Reduction", "Elementwise", "Fallback"]
    # each int8 rule before the float rule its kernels would otherwise fall to
    expected_first = [n for n in ("VNNIMatmul", "Gemm", "VNNIConv2d", "BlockedConv2d", "Depthwise", "Conv2d")
                      if hasattr(cpu_rules, n)]
    assert names[: len(expected_first)] == expected_first


def test_gpu_rules_end_with_dlight_fallback():
    rules = default_rules(CUDA)
    assert rules and all(isinstance(r, schedules.cuda.RequireThreadBinding) for r in rules)
    assert type(rules[-1].rule).__name__ == "Fallback"


def test_no_rules_for_other_targets():
    assert default_rules(Target({"kind": "c"})) == []


class Raises(s_tir.dlight.base.ScheduleRule):
    def apply(self, func, target, tunable):
        raise RuntimeError("broken rule")


def test_a_raising_rule_is_skipped():
    func = next(iter(prim_funcs(legalized(small_model())).values()))
    scheduled = schedule_func(func, TARGET, [Raises(), cpu_rules.Fallback()])
    assert scheduled is not None and is_scheduled(scheduled)


def test_no_applicable_rule_leaves_function_alone():
    func = next(iter(prim_funcs(legalized(small_model())).values()))
    assert schedule_func(func, TARGET, []) is None


def test_schedules_imports_nothing_above_the_core():
    """The rules take their knobs as the core's ``CompileOptions``: importing them loads
    the core (and the package's lazy facade), never the library, the driver or the passes."""
    code = (
        "import sys, schedules; "
        "bad = [m for m in sys.modules if m.split('.')[0] == 'relax_passes' "
        "or m.startswith(('aicf_tvm.driver', 'aicf_tvm.library'))]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=schedules.__path__[0] + "/..")
