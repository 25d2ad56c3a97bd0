"""The pipeline: one composition for every entry point, the rewrite fixpoint (verified
after every step, bounded, stable) and normalize's batch-norm folding, which must keep
the op's meaning."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi

from aicf_tvm import verify_contracts
from aicf_tvm.core.report import FusionReport
from aicf_tvm.driver.models import BUILTIN_MODELS
from aicf_tvm.driver.pipeline import MAX_ROUNDS, compile, normalize, optimize, run_pipeline, schedule
from aicf_tvm.driver.tuning.run import lower_for_tuning
from aicf_tvm.runtime.targets import describe, resolve_target
from tests.conftest import run_vm
from tests.relax_passes.test_fold_batch_norm import conv_bn


def test_verify_runs_after_every_step_and_the_fixpoint_is_bounded():
    checked = []

    def check(mod):
        verify_contracts(mod)
        checked.append(mod)

    out = optimize(normalize(BUILTIN_MODELS["decoder_block_small"]()), FusionReport(), check=check)
    # lift+propagate, then per round Eliminate, Materialize, Fuse (each re-propagated)
    assert 1 + 3 <= len(checked) <= 1 + 3 * MAX_ROUNDS
    again = optimize(out, FusionReport(), check=verify_contracts)
    assert tvm_ffi.structural_equal(again, out)  # a fixpoint: nothing left to rewrite


def test_compile_schedules_exactly_the_kernels_tuning_measures():
    """Tuning keys its records by the PrimFuncs it saw: compile's module must be those
    kernels, scheduled, with no step of its own in between."""
    target = resolve_target({"kind": "llvm", "num-cores": 2})
    model = BUILTIN_MODELS["encoder_layer_small"]()
    compiled = _compile(model)
    tvm.ir.assert_structural_equal(schedule(lower_for_tuning(model, target), target), compiled.lowered)


def test_run_pipeline_stops_at_the_stage_asked_and_rejects_an_unknown_one():
    target = resolve_target({"kind": "llvm", "num-cores": 2})
    stages = run_pipeline(BUILTIN_MODELS["encoder_layer_small"](), target, until="kernels")
    assert stages.kernels is not None and stages.lowered is None and stages.executable is None
    with pytest.raises(ValueError, match="until='tune': not one of optimize, kernels, schedule, build"):
        run_pipeline(BUILTIN_MODELS["encoder_layer_small"](), target, until="tune")


def test_llvm_means_this_cpu():
    text = describe(resolve_target("llvm"))
    assert "mcpu=" in text and "num-cores=" in text


def _compile(mod):
    import aicf_tvm

    return aicf_tvm.compile(mod, target={"kind": "llvm", "num-cores": 2})


@pytest.mark.parametrize("case", [
    {"center": False, "scale": False},  # TVM's fold put gamma/beta in anyway
    {"training": True},  # Relax's default: batch statistics, never the moving ones
    {"data_layout": "NHWC", "kernel_layout": "OIHW", "axis": 3},  # TVM's fold raised ValueError
    {"axis": 2},  # not the conv's channel axis: TVM's fold folded along C regardless
], ids=["no_center_no_scale", "training", "nhwc_data_oihw_kernel", "axis_not_channel"])
def test_compile_keeps_the_meaning_of_batch_norm_after_a_conv(case):
    """Against TVM's default build, which legalizes batch_norm as topi computes it."""
    rng = np.random.default_rng(11)
    mod, x_shape = conv_bn(rng, **case)
    x = rng.standard_normal(x_shape).astype("float32")
    np.testing.assert_allclose(_compile(mod)(x), run_vm(mod, x)[0], rtol=1e-4, atol=1e-4)


def test_float16_onnx_conv_batch_norm_folds_and_matches_onnxruntime():
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(12)
    c = 4
    values = {"w": rng.standard_normal((c, 3, 3, 3)), "g": rng.standard_normal(c),
              "b": rng.standard_normal(c), "m": rng.standard_normal(c),
              "v": rng.uniform(0.5, 2.0, c)}
    inits = [numpy_helper.from_array(a.astype("float16"), n) for n, a in values.items()]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["y"], epsilon=1e-3),
             helper.make_node("Relu", ["y"], ["out"])]
    graph = helper.make_graph(
        nodes, "conv_bn_f16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT16, [1, c, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    onnx.checker.check_model(model)
    x = rng.standard_normal((1, 3, 8, 8)).astype("float16")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x})[0]
    compiled = _compile(model)
    assert [k.kind for k in compiled.kernels] == ["fused_conv2d_bias_act"]  # folded: one kernel
    got = compiled(x)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype("float32"), want.astype("float32"), rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("affine", [True, False])
def test_torch_eval_conv_batch_norm_folds_into_one_kernel(affine):
    """torch's eval-mode batch-norm comes in as training=False (affine=False as
    center=False, scale=False) and still folds into the conv's weights and bias."""
    import torch

    import aicf_tvm

    torch.manual_seed(13)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False),
                                torch.nn.BatchNorm2d(8, affine=affine), torch.nn.ReLU())
    with torch.no_grad():  # statistics far from the initial 0/1, as after training
        model[1].running_mean.uniform_(-1.0, 1.0)
        model[1].running_var.uniform_(0.5, 2.0)
        if affine:
            model[1].weight.uniform_(0.5, 2.0)
            model[1].bias.uniform_(-1.0, 1.0)
    model.eval()
    x = torch.randn(1, 3, 16, 16)
    compiled = _compile(aicf_tvm.from_torch(model, [x]))
    assert [k.kind for k in compiled.kernels] == ["fused_conv2d_bias_act"]
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(compiled(x.numpy()), want, rtol=1e-4, atol=1e-4)


def test_ops_bound_outside_a_dataflow_block_are_lifted_and_fused():
    """A BlockBuilder function without ``bb.dataflow()``: its matmul + bias is one fused
    GEMM kernel (it ran as TVM's separate transpose, matmul and add kernels), and right."""
    from tvm import relax

    import aicf_tvm

    rng = np.random.default_rng(7)
    weight = rng.standard_normal((48, 32)).astype("float32")
    bias = rng.standard_normal((48,)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 32), "float32"))
    with bb.function("main", [x]):
        y = bb.emit(relax.op.matmul(x, relax.op.permute_dims(relax.const(weight))))
        bb.emit_func_output(bb.emit(relax.op.add(y, relax.const(bias))))
    compiled = aicf_tvm.compile(bb.get(), target="llvm")
    assert [k.kind for k in compiled.kernels] == ["fused_gemm_bias_act"]
    data = rng.standard_normal((1, 16, 32)).astype("float32")
    got = compiled(data)
    got = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
    np.testing.assert_allclose(got, data @ weight.T + bias, rtol=1e-5, atol=1e-5)


def test_compile_records_its_phase_times_and_prints_them_on_request(capsys):
    model = compile(BUILTIN_MODELS["encoder_layer_small"](), timings=True)
    assert list(model.timings) == ["normalize", "fuse", "lower", "schedule", "codegen", "jit"]
    assert all(secs >= 0 for secs in model.timings.values())
    printed = capsys.readouterr().err
    assert printed.startswith("compile phases:") and all(name in printed for name in model.timings)


def test_compile_makes_the_machine_code_and_vm_before_the_first_call():
    """``warm_up`` (the default): the calling thread's VM exists when ``compile`` returns,
    its kernels' machine code made (phase "jit"); ``warm_up=False`` leaves both to the
    first call, which then gives the same output."""
    mod = BUILTIN_MODELS["encoder_layer_small"]()
    warm, cold = compile(mod), compile(mod, warm_up=False)
    assert getattr(warm._vms, "vm", None) is not None and "jit" in warm.timings
    assert getattr(cold._vms, "vm", None) is None and "jit" not in cold.timings
    args = [np.random.default_rng(i).standard_normal([int(d) for d in spec.shape]).astype(spec.dtype)
            for i, spec in enumerate(warm.inputs)]
    np.testing.assert_array_equal(np.asarray(warm(*args)), np.asarray(cold(*args)))


def test_each_kernel_is_a_module_of_its_own_with_the_bits_of_one_module():
    """``build_in_parts``: one LLVM module per kernel, imports of the executable, built and
    JIT-compiled by one thread per core; the outputs are the bits of TVM's one-module build
    of the same scheduled kernels, and both are near TVM's unoptimized build."""
    from tvm import relax

    from aicf_tvm.driver.pipeline import backend_passes, build_in_parts, device_checks
    from aicf_tvm.runtime.compiled import jit_in_parallel
    from schedules.cpu.codegen import codegen_target
    from schedules.cpu.parallel_guard import tir_pipeline
    from tests.conftest import random_inputs

    target = resolve_target({"kind": "llvm", "num-cores": 2})
    mod = BUILTIN_MODELS["encoder_layer_small"]()
    lowered = device_checks(run_pipeline(mod, target, until="schedule").lowered, target)
    kernels = [gv for gv, f in lowered.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    machine, passes = codegen_target(target), tvm.transform.Sequential(backend_passes(target))
    parts = build_in_parts(lowered, machine, passes, tir_pipeline())
    llvm = [m for m in parts.mod.imports if m.kind == "llvm"]
    assert len(llvm) == len(kernels) > 1
    jit_in_parallel(parts)
    with machine:
        whole = tvm.compile(lowered, target=machine, relax_pipeline=passes, tir_pipeline=tir_pipeline())
    assert len([m for m in whole.mod.imports if m.kind == "llvm"]) == 1
    args = random_inputs(mod)
    runs = [relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()
            for ex in (parts, whole)]
    np.testing.assert_array_equal(runs[0], runs[1])
    np.testing.assert_allclose(runs[0], run_vm(mod, *args)[0], rtol=1e-4, atol=1e-4)
    other = random_inputs(mod, seed=1)
    assert not np.array_equal(relax.VirtualMachine(parts, tvm.cpu())["main"](
        *[tvm.runtime.tensor(a) for a in other]).numpy(), runs[0])
