"""explain and `aicf explain`: the Emit table and the opaque count."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import tvm
from tvm import relax

import aicf_tvm
from aicf_tvm import explain
from aicf_tvm.driver.models import BUILTIN_MODELS
from aicf_tvm.runtime.deploy import FORMAT_VERSION

from ...conftest import light_model_path


def test_explain_lists_every_emit_with_facts():
    text = explain(BUILTIN_MODELS["encoder_layer_small"]())
    assert "softmax" in text and "layer_norm" in text
    assert "strides(" in text  # permute_dims outputs are shown as strided views
    assert "opaque Emits: 0" in text


def test_explain_names_each_opaque_emit_and_its_op():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.unique(x, sorted=True))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    text = explain(bb.get())
    assert "opaque Emits: 1" in text and "<- relax.unique" in text


def test_cli_explain_on_an_onnx_file():
    res = subprocess.run([sys.executable, "-m", "aicf_tvm.driver.cli", "explain", str(light_model_path("squeezenet"))],
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    assert "conv2d" in res.stdout and "opaque Emits: 0" in res.stdout


def test_cli_explain_missing_file_is_one_line_error():
    res = subprocess.run([sys.executable, "-m", "aicf_tvm.driver.cli", "explain", "no_such_model.onnx"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == ["aicf: error: no_such_model.onnx: no such file"]


def test_cli_explain_shows_kernel_selection_per_emit(capsys):
    from aicf_tvm.driver.cli import main

    assert main(["explain", "encoder_layer_small"]) == 0
    out = capsys.readouterr().out
    assert "kernel selection for llvm mcpu=" in out and "num-cores=" in out
    rows = [line.split(maxsplit=4) for line in out.split("kernel selection", 1)[1].splitlines()[2:] if line.strip()]
    assert rows and all(r[3] in {"Gemm", "Conv2d", "Attention", "Reduction", "Elementwise", "Fallback", "tuned"}
                        for r in rows)
    assert any(r[2] == "fused_attention" for r in rows)
    # the GEMM and attention rules' choices, each in its row
    plans = {r[3]: r[4] for r in rows if len(r) == 5}
    assert plans["Gemm"].startswith("tile ") and "rows x" in plans["Gemm"] and "kc " in plans["Gemm"]
    attention = plans["Attention"]
    assert "key vectors" in attention and ("one pass" in attention or "two passes" in attention)
    # the p·v register tiles cover the head dimension (16 in encoder_layer_small) once
    import re

    from aicf_tvm.runtime.targets import resolve_target
    from schedules.cpu.common import float32_lanes

    parts, vectors = map(int, re.search(r"head dim in (\d+) part\(s\) of (\d+) vectors", attention).groups())
    assert parts * vectors * min(float32_lanes(resolve_target("llvm")), 16) == 16


def test_kernel_plans_name_the_tile_the_gemm_rule_chose():
    """Each GEMM kernel's plan (CompiledModel.kernels, the export's manifest) names the
    register tile, kc and where the epilogue runs, as the plan of gemm_plan.plan_gemm for
    that shape on this target says."""
    import re

    from schedules.cpu.common import float32_lanes, gemm_tiles_by_area, num_cores, vector_registers
    from schedules.cpu.gemm_plan import plan_gemm

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((200, 300), "float32"))
    w = relax.const(np.random.default_rng(0).standard_normal((300, 640), dtype=np.float32))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.relu(relax.op.matmul(x, w))))
        bb.emit_func_output(out)
    model = aicf_tvm.compile(bb.get(), cache=False)
    gemms = [k for k in model.kernels if k.schedule == "Gemm"]
    assert len(gemms) == 1
    target = model.target
    plan = plan_gemm(1, 200, 640, 300, float32_lanes(target), num_cores(target), vector_registers(target),
                     b_contiguous_in_n=True, tile_by_area=gemm_tiles_by_area(target), b_constant=True)
    found = re.match(r"tile (\d+) rows x (\d+) vectors, kc (\d+)", gemms[0].plan)
    assert found is not None, gemms[0].plan
    assert tuple(map(int, found.groups())) == (plan.mr, plan.nr // plan.lanes, plan.kc)
    assert "epilogue per tile" in gemms[0].plan  # K = 300: one block


def test_cli_explain_on_a_compiled_library_prints_its_manifest(tmp_path):
    """A library's manifest comes from its metadata alone: none of our compiler side is loaded."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((tvm.tirx.Var("n", "int64"), 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.relu(relax.op.add(x, x))))
        bb.emit_func_output(out)
    lib = aicf_tvm.compile(bb.get()).export(tmp_path / "relu.so")
    code = ("import sys; from aicf_tvm.driver.cli import main; rc = main(['explain', sys.argv[1]]); "
            "compiler = ('relax_passes', 'schedules', 'aicf_tvm.driver.pipeline'); "
            "assert not [m for m in sys.modules if m.startswith(compiler)]; "
            "sys.exit(rc)")
    res = subprocess.run([sys.executable, "-c", code, str(lib)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    text = res.stdout
    assert text.startswith(f"{lib}: AICF module (format {FORMAT_VERSION}") and "target: llvm" in text
    assert "x: float32[n, 8]" in text and "output: float32[n, 8]" in text
    assert "kernels (1):" in text and "fused_elementwise" in text and "fusion:" in text
