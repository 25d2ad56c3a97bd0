"""End to end: tuning a blocked conv2d measures our rule's plans, and what it picks runs right.

``BlockedConv2d`` offers complete schedules (register tiles and task orders around its
default, nothing sampled), so a task's share of the trials is capped at their count and
spent measuring them; every record replays to a kernel that computes the convolution.
Kept small: two 3x3 convolutions of 32 channels at 28x28, about a minute on 2 cores.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import tvm
from tvm import relax
from tvm.s_tir import meta_schedule as ms

import aicf_tvm
from schedules.select import open_database

# one worker for the tuning tests that time kernels against each other (pyproject.toml)
pytestmark = pytest.mark.xdist_group("tuning")

SHAPE = (1, 32, 28, 28)
_RNG = np.random.default_rng(0)
LAYERS = [(_RNG.standard_normal((32, 32, 3, 3)).astype("float32") / 10, _RNG.standard_normal((32,)).astype("float32"))
          for _ in range(2)]


def conv_model() -> tvm.IRModule:
    """Two relu(conv2d(y, W, padding 1) + b) on constant weights: a chain the layout step
    blocks (one blocked-conv task called twice)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for w, b in LAYERS:
                y = bb.emit(relax.op.nn.conv2d(y, relax.const(w), padding=1))
                y = bb.emit(relax.op.nn.relu(relax.op.add(y, relax.const(b.reshape(1, -1, 1, 1)))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def reference(x: np.ndarray) -> np.ndarray:
    y = torch.from_numpy(x).double()
    for w, b in LAYERS:
        y = torch.relu(torch.nn.functional.conv2d(y, torch.from_numpy(w).double(), torch.from_numpy(b).double(),
                                                  padding=1))
    return y.numpy()


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A tuned work dir, every plan timed in the model whatever its kernel time (the
    model-timing tests below check that every candidate went there)."""
    from aicf_tvm.driver.tuning import in_models

    work_dir = tmp_path_factory.mktemp("conv_tuning")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(in_models, "PLAUSIBLE", float("inf"))
        result = aicf_tvm.tune(conv_model(), trials=64, work_dir=work_dir, progress=False)
    return work_dir, result


def test_the_trials_are_our_rules_plans_each_measured_once(tuned):
    from schedules.tuning.space import design_spaces, space_count

    work_dir, result = tuned
    (task,) = result.tasks
    assert "conv2d" in task.kind and task.default_s is not None
    db = open_database(work_dir)
    (workload,) = [db.get_all_tuning_records()[0].workload.mod]
    spaces = design_spaces(workload, result.target)
    assert result.measured == space_count(spaces) == len(spaces) - 1 > 0  # capped below 64
    traces = [str(r.trace) for r in db.get_all_tuning_records()]
    assert sorted(traces) == sorted(str(s.trace) for s in spaces)  # the default once, no searched record
    summary = json.loads((work_dir / "aicf_tuning.json").read_text())["tasks"][task.key]
    assert summary["choice"] == task.choice and summary["trials"] == len(spaces) - 1


def test_every_record_replays_to_a_correct_kernel(tuned):
    """Each measured plan, compiled alone from its record, computes the convolution."""
    work_dir, _ = tuned
    x = np.random.default_rng(2).standard_normal(SHAPE).astype("float32")
    other = np.random.default_rng(3).standard_normal(SHAPE).astype("float32")
    assert not np.allclose(reference(x), reference(other))
    for record in open_database(work_dir).get_all_tuning_records():
        only = ms.database.MemoryDatabase()
        only.commit_tuning_record(ms.database.TuningRecord(
            record.trace, only.commit_workload(record.workload.mod), record.run_secs, record.target,
            record.args_info))
        compiled = aicf_tvm.compile(conv_model(), database=only)
        assert [k.schedule for k in compiled.kernels if "conv2d" in k.name] == ["tuned", "tuned"]
        np.testing.assert_allclose(compiled(x), reference(x), rtol=1e-4, atol=1e-3)


def test_compile_uses_the_choice_and_stays_right(tuned):
    work_dir, result = tuned
    compiled = aicf_tvm.compile(conv_model(), database=work_dir)
    expected = "tuned" if result.tasks[0].choice == "tuned" else "BlockedConv2d"
    assert [k.schedule for k in compiled.kernels if "conv2d" in k.name] == [expected, expected]
    x = np.random.default_rng(4).standard_normal(SHAPE).astype("float32")
    np.testing.assert_allclose(compiled(x), reference(x), rtol=1e-4, atol=1e-3)


def test_the_candidates_were_timed_in_the_model_and_that_choice_is_saved(tuned):
    import aicf_tvm.driver.tuning.in_models as tm
    from schedules.tuning.measure import WIN_MARGIN

    work_dir, result = tuned
    (task,) = result.tasks
    assert task.in_model is not None and "timed in the model" in result.in_model
    assert task.in_model["candidates"] == min(tm.MODEL_CANDIDATES, result.measured)
    assert 0 < task.in_model["default_s"] and 0 < task.in_model["tuned_s"]
    if task.choice == "tuned":  # won its confirming turns: turn by turn and median to median
        assert task.in_model["tuned_s"] < WIN_MARGIN * task.in_model["default_s"]
        assert task.record is not None
    summary = json.loads((work_dir / "aicf_tuning.json").read_text())["tasks"][task.key]
    assert summary["in_model"] == task.in_model
    assert (summary["choice"], summary["record"]) == (task.choice, task.record)


def test_given_choices_replace_the_work_dirs(tuned):
    """``schedule(..., choices=)`` builds what those choices name, whatever the work dir chose."""
    from aicf_tvm.driver.pipeline import schedule
    from aicf_tvm.driver.tuning.run import lower_for_tuning
    from schedules.select import record_digest

    work_dir, result = tuned
    (task,) = result.tasks
    kernels = lower_for_tuning(conv_model(), result.target)
    records = open_database(work_dir).get_all_tuning_records()
    for choice in ({"choice": "tuned", "record": record_digest(records[-1].trace)},
                   {"choice": "default", "record": None}):
        lowered = schedule(kernels, result.target, work_dir, choices={task.key: choice})
        labels = [str(f.attrs["aicf.schedule"]) for _, f in lowered.functions_items()
                  if isinstance(f, tvm.tirx.PrimFunc) and "conv2d" in f.attrs.get("aicf.kind", "")]
        assert labels == (["tuned"] if choice["record"] else ["BlockedConv2d"])  # one kernel, called twice


def test_the_instrument_charges_each_kernel_call_to_its_task():
    """The VM calls the kernels by the names tuning's tasks use, and their seconds add up
    to no more than the call."""
    import time

    from aicf_tvm.driver.tuning.in_models import kernel_seconds

    compiled = aicf_tvm.compile(conv_model())
    names = [k.name for k in compiled.kernels if "conv2d" in k.name]
    assert len(set(names)) == 1
    x = np.random.default_rng(5).standard_normal(SHAPE).astype("float32")
    compiled(x)
    spent: dict[str, float] = __import__("collections").defaultdict(float)
    begin = time.perf_counter()
    kernel_seconds(compiled, [x], {names[0]: "conv"}, spent)
    wall = time.perf_counter() - begin
    assert set(spent) == {"conv"} and 0 < spent["conv"] < wall


def test_each_variant_is_built_with_its_own_records(tuned):
    """Variants built one after another from one module of kernels: each has the schedule
    its records name (not the first build's), and runs right."""
    import aicf_tvm.driver.tuning.in_models as tm
    from aicf_tvm.driver.tuning.run import lower_for_tuning
    from schedules.select import load_choices, record_digest

    work_dir, result = tuned
    (task,) = result.tasks
    kernels = lower_for_tuning(conv_model(), result.target)
    x = np.random.default_rng(6).standard_normal(SHAPE).astype("float32")
    model = tm.TimedModel("model0", kernels, [x])
    variants = tm._Variants([model], {"model0": {}}, result.target, work_dir, load_choices(work_dir), None,
                            lambda: None)
    digest = record_digest(open_database(work_dir).get_all_tuning_records()[-1].trace)
    for record, label in ((None, "BlockedConv2d"), (digest, "tuned"), (None, "BlockedConv2d")):
        (compiled,) = variants.build({task.key: record})
        assert {k.schedule for k in compiled.kernels if "conv2d" in k.name} == {label}
        np.testing.assert_allclose(compiled(x), reference(x), rtol=1e-4, atol=1e-3)
