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
    work_dir = tmp_path_factory.mktemp("conv_tuning")
    result = aicf_tvm.tune(conv_model(), trials=64, work_dir=work_dir, progress=False)
    return work_dir, result


def test_the_trials_are_our_rules_plans_each_measured_once(tuned):
    from schedules.tune_space import design_spaces, space_count

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
