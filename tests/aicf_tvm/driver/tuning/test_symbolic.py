"""``aicf tune`` on a model with a symbolic dim: its GEMM is tuned in the rule's choices at
representative bindings, and ``compile(database=...)`` schedules the symbolic kernel by the
chosen one (schedules/tune_symbolic.py).

One real tuning run (a 64x48 GEMM of 1..256 rows, one candidate: about 20 s on 2 busy
cores); the other tests stub the timing (``tune_symbolic.measure_at``) to force a choice.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable

import numpy as np
import onnx
import pytest
import tvm
import tvm_ffi
from tvm import relax, tirx

import aicf_tvm
import schedules.tuning.symbolic as tune_symbolic
from aicf_tvm.core.errors import TuningError
from aicf_tvm.core.options import CompileOptions
from aicf_tvm.driver.cli import main
from aicf_tvm.driver.symbolic import with_dim_bounds
from aicf_tvm.driver.tuning.run import lower_for_tuning
from aicf_tvm.runtime.targets import resolve_target
from schedules.cpu import Gemm
from schedules.select import CHOICES_FILE, apply_database, workload_of
from schedules.tuning.space import timed_form
from tests.aicf_tvm.driver.test_cli import _static_linear_onnx
from tests.helpers import relax_main

K, N, UPPER = 64, 48, 256
BINDINGS = ["rows=1", "rows=16", "rows=256"]  # representative_values(1, 256)


@pytest.fixture(scope="module")
def weights() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(20)
    return rng.standard_normal((K, N)).astype("float32"), rng.standard_normal((N,)).astype("float32")


@pytest.fixture(scope="module")
def model(weights) -> tvm.IRModule:
    """relu(x @ w + b) for x of shape [rows, K], rows bounded by 1:UPPER."""
    w, b = weights
    rows = tirx.Var("rows", "int64")
    x = relax.Var("x", relax.TensorType([rows, K], "float32"))
    mod = relax_main([x], lambda bb, x: relax.op.nn.relu(
        bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, relax.const(w))), relax.const(b)))))
    return with_dim_bounds(mod, {"rows": (1, UPPER)})


def choices_of(model: tvm.IRModule, options: CompileOptions | None = None) -> list[tuple[dict, tvm.s_tir.Schedule]]:
    """The GEMM rule's choices of the model's kernel, as tuning (with ``options``) sees it."""
    target = resolve_target("llvm")
    (func,) = [f for _, f in lower_for_tuning(model, target, options).functions_items()
               if isinstance(f, tirx.PrimFunc)]
    return Gemm(options).choices(workload_of(func, target, options)["main"], target)


def stub_timing(monkeypatch, model: tvm.IRModule, seconds: Callable[[dict, int], float],
                options: CompileOptions | None = None) -> list[dict]:
    """Time each candidate as ``seconds(choice, binding index)`` instead of running it;
    returns the choices in the rule's order (tuned with ``options``)."""
    choices = choices_of(model, options)
    by_module = {tvm_ffi.structural_hash(timed_form(s.mod)): c for c, s in choices}

    def measure_at(mods, bindings, target, tools, rounds):
        return [[[seconds(by_module[tvm_ffi.structural_hash(m)], i) for i in range(len(bindings))]
                 for _ in range(rounds)] for m in mods]

    monkeypatch.setattr(tune_symbolic, "measure_at", measure_at)
    return [c for c, _ in choices]


def reference(weights, x: np.ndarray) -> np.ndarray:
    w, b = weights
    return np.maximum(x @ w + b, 0)


def assert_runs_right(compiled, weights, rows=(1, 7, 64, UPPER)) -> None:
    rng = np.random.default_rng(21)
    for m in rows:
        x = rng.standard_normal((m, K)).astype("float32")
        np.testing.assert_allclose(compiled(x), reference(weights, x), rtol=1e-4, atol=1e-4, err_msg=f"rows={m}")


def test_a_real_run_times_the_choices_at_representative_bindings(model, weights, tmp_path):
    result = aicf_tvm.tune(model, trials=1, trials_per_task=1, work_dir=tmp_path, progress=False,
                           builder_timeout=300)
    (task,) = result.tasks
    assert result.measured == 1 and task.trials == 1 and task.bindings == BINDINGS
    assert task.default_s is not None and task.tuned_s is not None
    assert "symbolic, timed at rows=1 | rows=16 | rows=256" in result.summary()
    (entry,) = json.loads((tmp_path / CHOICES_FILE).read_text())["tasks"].values()
    assert entry["bindings"] == BINDINGS and entry["record"] is None
    assert (entry["plan"] is not None) == (entry["choice"] == "tuned")
    compiled = aicf_tvm.compile(model, database=tmp_path)
    label = tune_symbolic.choice_label(entry["plan"]) if entry["plan"] else "Gemm"
    assert [k.schedule for k in compiled.kernels] == [label]
    assert_runs_right(compiled, weights)


@pytest.mark.parametrize("differs_in", ["parallel_m", "pack_b", "nr"])
def test_compile_schedules_the_symbolic_kernel_by_the_chosen_plan(monkeypatch, model, weights, tmp_path,
                                                                  differs_in):
    """A choice that is not the default's, made faster at every binding: it is saved, and
    compile schedules the symbolic kernel by it (another kernel than the default's) and
    runs it right at every row count in the bounds; a second run resumes it."""
    forced = None

    def seconds(choice, binding):
        return 1e-5 * (0.5 if choice == forced else 1.0 if choice == choices[0] else 1.5)

    choices = stub_timing(monkeypatch, model, seconds)
    forced = next(c for c in choices if c[differs_in] != choices[0][differs_in])
    trials = choices.index(forced)  # the candidates up to the forced one
    result = aicf_tvm.tune(model, trials=trials, trials_per_task=trials, work_dir=tmp_path, progress=False)
    (task,) = result.tasks
    assert task.choice == "tuned" and task.plan == {"rule": "Gemm", "choice": forced}
    assert math.isclose(task.tuned_s / task.default_s, 0.5)
    compiled = aicf_tvm.compile(model, database=tmp_path)
    default = aicf_tvm.compile(model)
    assert [k.schedule for k in compiled.kernels] == [tune_symbolic.choice_label(task.plan)]
    assert [k.schedule for k in default.kernels] == ["Gemm"]
    ours, theirs = compiled.kernels[0].name, default.kernels[0].name
    assert not tvm_ffi.structural_equal(compiled.lowered[ours], default.lowered[theirs])
    assert_runs_right(compiled, weights)
    again = aicf_tvm.tune(model, trials=trials, trials_per_task=trials, work_dir=tmp_path, progress=False)
    assert again.measured == 0 and again.tasks[0].skipped and again.tasks[0].plan == task.plan


@pytest.mark.parametrize(("small", "choice"), [
    (2.0, "tuned"),  # 2x slower at 1 row, 0.6x at 16 and 256: geometric mean 0.90
    (3.0, "default"),  # 3x slower at 1 row: geometric mean 1.08 (a sum of times would say 0.6x)
])
def test_every_binding_weighs_the_same(monkeypatch, model, tmp_path, small, choice):
    """Candidate over default, per binding: the geometric mean decides, not the time
    summed over the bindings (which the largest binding would rule)."""
    default_secs = [1e-6, 1e-5, 1e-3]
    forced = None

    def seconds(c, binding):
        if c == forced:
            return default_secs[binding] * (small if binding == 0 else 0.6)
        return default_secs[binding] * (1.0 if c == choices[0] else 1.5)

    choices = stub_timing(monkeypatch, model, seconds)
    forced = choices[1]
    (task,) = aicf_tvm.tune(model, trials=4, trials_per_task=4, work_dir=tmp_path, progress=False).tasks
    assert task.choice == choice and (task.plan is not None) == (choice == "tuned")


def test_a_choice_tuned_under_other_knobs_is_replayed_only_with_them(monkeypatch, model, weights, tmp_path):
    """Tuned with ``CompileOptions`` knobs, the choice is saved under a key of its own and
    ``compile`` with the same options schedules the kernel by it (the rule built with those
    knobs); with the default options it is not applied."""
    knobs = CompileOptions(gemm_prefetch_b_panels=False, gemm_area_slack=1.3)
    forced = None
    choices = stub_timing(monkeypatch, model, lambda c, i: 1e-5 * (0.5 if c == forced else 1.0 if c == choices[0]
                                                                   else 1.5), knobs)
    # a plan other than the default (the default is measured in any case) whose B panels the
    # default knobs prefetch: on an AVX2 host the default plan packs B itself
    forced = next(c for c in choices[1:] if c["pack_b"])
    trials = choices.index(forced)
    (task,) = aicf_tvm.tune(model, trials=trials, trials_per_task=trials, work_dir=tmp_path, progress=False,
                            options=knobs).tasks
    assert task.choice == "tuned" and task.plan == {"rule": "Gemm", "choice": forced}
    (entry,) = json.loads((tmp_path / CHOICES_FILE).read_text())["tasks"].values()
    assert entry["options"] == {"gemm_prefetch_b_panels": False, "gemm_area_slack": 1.3}
    compiled = aicf_tvm.compile(model, database=tmp_path, options=knobs)
    assert [k.schedule for k in compiled.kernels] == [tune_symbolic.choice_label(task.plan)]
    target = resolve_target("llvm")
    kernels = lower_for_tuning(model, target, knobs)
    ((gv, func),) = [(gv, f) for gv, f in kernels.functions_items() if isinstance(f, tirx.PrimFunc)]
    selected = apply_database(kernels.clone(), target, tmp_path, options=knobs)[gv]
    replay = tune_symbolic.apply_choice(func, target, task.plan, knobs).mod["main"]  # the knobs' rule
    assert tvm_ffi.structural_equal(selected.body, replay.body)
    assert not tvm_ffi.structural_equal(replay.body,
                                        tune_symbolic.apply_choice(func, target, task.plan).mod["main"].body)
    assert [k.schedule for k in aicf_tvm.compile(model, database=tmp_path).kernels] == ["Gemm"]
    assert_runs_right(compiled, weights, rows=(3, UPPER))


def _tuned_dir(monkeypatch, model, tmp_path):
    choices = stub_timing(monkeypatch, model, lambda c, i: 1e-5 * (1.0 if c == choices[0] else 0.5))
    aicf_tvm.tune(model, trials=4, trials_per_task=4, work_dir=tmp_path, progress=False)
    return tmp_path / CHOICES_FILE


def test_a_corrupt_choice_is_an_error_naming_its_kernel(monkeypatch, model, tmp_path):
    path = _tuned_dir(monkeypatch, model, tmp_path)
    summary = json.loads(path.read_text())
    (key,) = summary["tasks"]
    summary["tasks"][key]["plan"]["choice"]["mr"] = "four"
    path.write_text(json.dumps(summary))
    saved = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(TuningError, match=f"task '{key}', a kernel with symbolic extents.*left untouched"):
        aicf_tvm.compile(model, database=tmp_path)
    with pytest.raises(TuningError, match=f"task '{key}'"):
        aicf_tvm.tune(model, trials=4, trials_per_task=4, work_dir=tmp_path, progress=False)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == saved


def test_a_choice_the_rule_does_not_offer_keeps_the_default(monkeypatch, model, weights, tmp_path, caplog):
    path = _tuned_dir(monkeypatch, model, tmp_path)
    summary = json.loads(path.read_text())
    (entry,) = summary["tasks"].values()
    entry["plan"]["choice"]["mr"] = 999
    path.write_text(json.dumps(summary))
    with caplog.at_level(logging.WARNING, logger="schedules.select"):
        compiled = aicf_tvm.compile(model, database=tmp_path)
    assert [k.schedule for k in compiled.kernels] == ["Gemm"]
    assert "is not one its rule offers" in caplog.text
    assert_runs_right(compiled, weights, rows=(3, UPPER))


def test_cli_tunes_a_dynamic_onnx_model(monkeypatch, tmp_path, capsys):
    """``aicf tune --shape x=rows,? --dim rows=1:64`` no longer refuses: it lists the
    kernel tuned and the bindings it was timed at, and ``aicf compile --database`` uses it."""
    onnx.save(_static_linear_onnx(), tmp_path / "linear.onnx")
    dims = ["--shape", "x=rows,?", "--dim", "rows=1:64"]
    from aicf_tvm.driver.frontends import load_model

    model = load_model(str(tmp_path / "linear.onnx"), shapes={"x": ["rows", "?"]}, bounds={"rows": (1, 64)})
    choices = stub_timing(monkeypatch, model, lambda c, i: 1e-5 * (1.0 if c == choices[0] else 0.5))
    work = tmp_path / "work"
    assert main(["tune", str(tmp_path / "linear.onnx"), "--work-dir", str(work), "--trials", "4", *dims]) == 0
    out = capsys.readouterr().out
    assert "symbolic, timed at rows=1 | rows=8 | rows=64: tuned Gemm(" in out
    assert main(["explain", str(tmp_path / "linear.onnx"), "--database", str(work), *dims]) == 0
    table = capsys.readouterr().out.split("kernel selection for")[1].splitlines()[2:]
    assert len(table) == 1 and table[0].rstrip().endswith(")") and "  tuned Gemm(mr=" in table[0]
    lib = tmp_path / "linear.so"
    assert main(["compile", str(tmp_path / "linear.onnx"), "-o", str(lib), "--database", str(work), *dims]) == 0
    w = onnx.numpy_helper.to_array(_static_linear_onnx().graph.initializer[0])
    compiled = aicf_tvm.load(lib)
    assert compiled.kernels[0].schedule.startswith("tuned Gemm(")
    rng = np.random.default_rng(22)
    for rows in (1, 5, 64):
        x = rng.standard_normal((rows, 8)).astype("float32")
        np.testing.assert_allclose(compiled(x), np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)
