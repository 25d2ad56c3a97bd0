"""End to end: ``aicf_tvm.tune`` writes records that ``compile(database=...)`` applies.

Kept tiny (one 64x128x96 GEMM, at most 6 measured candidates, a raised builder timeout)
because it really runs MetaSchedule: about two minutes on 2 busy cores.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import aicf_tvm
from aicf_tvm.errors import TuningError
from schedules.tune import WIN_MARGIN
from tests.schedules.test_tune import gemm_model

TRIALS = 4


def reference(x: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((128, 96)).astype("float32")
    b = rng.standard_normal((96,)).astype("float32")
    return np.maximum(x @ w + b, 0)


@pytest.fixture(scope="module")
def model():
    return gemm_model([(128, 96)])


@pytest.fixture(scope="module")
def tuned(model, tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("tuning")
    result = aicf_tvm.tune(model, trials=TRIALS, trials_per_task=TRIALS, work_dir=work_dir,
                           builder_timeout=300, progress=False)
    return work_dir, result


def copy_of(work_dir, tmp_path):
    return shutil.copytree(work_dir, tmp_path / "copy")


def test_writes_records_and_measures_the_default(tuned):
    work_dir, result = tuned
    (task,) = result.tasks
    assert task.kind == "fused_gemm_bias_act" and task.trials == TRIALS
    assert task.default_s is not None and task.tuned_s is not None
    assert task.choice == ("tuned" if task.tuned_s < WIN_MARGIN * task.default_s else "default")
    lines = (work_dir / "database_tuning_record.json").read_text().splitlines()
    assert len(lines) == TRIALS + 1  # the searched candidates and the default schedule
    summary = json.loads((work_dir / "aicf_tuning.json").read_text())["tasks"]
    assert summary[task.key]["choice"] == task.choice


def test_compile_keeps_the_faster_of_default_and_tuned(model, tuned):
    work_dir, result = tuned
    (kernel,) = aicf_tvm.compile(model, database=work_dir).kernels
    assert kernel.schedule == ("tuned" if result.tasks[0].choice == "tuned" else "Gemm")


def test_compile_applies_a_winning_record(model, tuned, tmp_path):
    """Mark the record as the winner (as a faster measurement would): compile uses it."""
    work_dir, _ = tuned
    copy = copy_of(work_dir, tmp_path)
    summary = json.loads((copy / "aicf_tuning.json").read_text())
    for entry in summary["tasks"].values():
        entry["choice"] = "tuned"
    (copy / "aicf_tuning.json").write_text(json.dumps(summary))
    compiled = aicf_tvm.compile(model, database=copy)
    assert [k.schedule for k in compiled.kernels] == ["tuned"]
    x = np.random.default_rng(1).standard_normal((64, 128)).astype("float32")
    np.testing.assert_allclose(compiled(x), reference(x), rtol=1e-4, atol=1e-4)


def test_a_searched_record_replays_correctly(model, tuned):
    """The best schedule MetaSchedule found (not the default's), applied alone, is right."""
    from tvm.s_tir import meta_schedule as ms

    from aicf_tvm.driver.targets import resolve_target
    from aicf_tvm.driver.tuning import lower_for_tuning
    from schedules.select import open_database
    from schedules.tune import Baseline, default_schedule, extract_tasks, tuned_records

    work_dir, _ = tuned
    target = resolve_target("llvm")
    (task,) = extract_tasks([("m", lower_for_tuning(model, target))], target)
    baseline = Baseline(str(default_schedule(task.workload, target).trace), None)
    best = tuned_records(open_database(work_dir), task, baseline)[0]
    only = ms.database.MemoryDatabase()
    only.commit_tuning_record(ms.database.TuningRecord(
        best.trace, only.commit_workload(task.workload), best.run_secs, target, best.args_info))
    compiled = aicf_tvm.compile(model, database=only)
    assert [k.schedule for k in compiled.kernels] == ["tuned"]
    x = np.random.default_rng(2).standard_normal((64, 128)).astype("float32")
    np.testing.assert_allclose(compiled(x), reference(x), rtol=1e-4, atol=1e-4)


def test_resume_skips_finished_tasks(model, tuned, tmp_path):
    work_dir, _ = tuned
    copy = copy_of(work_dir, tmp_path)
    before = (copy / "database_tuning_record.json").read_bytes()
    again = aicf_tvm.tune(model, trials=TRIALS, trials_per_task=TRIALS, work_dir=copy, progress=False)
    assert again.measured == 0 and again.tasks[0].skipped
    assert (copy / "database_tuning_record.json").read_bytes() == before


def test_resume_continues_an_unfinished_task(model, tuned, tmp_path):
    """A run stopped after 4 of 6 trials measures only the missing ones and keeps the rest."""
    work_dir, _ = tuned
    copy = copy_of(work_dir, tmp_path)
    before = (copy / "database_tuning_record.json").read_text()
    again = aicf_tvm.tune(model, trials=TRIALS + 2, trials_per_task=TRIALS + 2, work_dir=copy,
                          builder_timeout=300, progress=False)
    after = (copy / "database_tuning_record.json").read_text()
    assert 0 < again.measured <= 2 and after.startswith(before)


def test_corrupt_database_raises_and_is_not_overwritten(model, tuned, tmp_path):
    work_dir, _ = tuned
    copy = copy_of(work_dir, tmp_path)
    path = copy / "database_tuning_record.json"
    path.write_text(path.read_text() + '[0, [["GetSBlock"\n')  # a row cut short
    before = path.read_bytes()
    with pytest.raises(TuningError, match="corrupt at line"):
        aicf_tvm.tune(model, trials=TRIALS, work_dir=copy, progress=False)
    with pytest.raises(TuningError, match="corrupt at line"):
        aicf_tvm.compile(model, database=copy)
    assert path.read_bytes() == before


def test_no_candidate_built_raises(model, tmp_path):
    """A builder timeout shorter than any build fails every candidate: say so."""
    with pytest.raises(TuningError, match="built.*builder_timeout"):
        aicf_tvm.tune(model, trials=2, work_dir=tmp_path / "w", builder_timeout=0.001, progress=False)
