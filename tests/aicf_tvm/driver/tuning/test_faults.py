"""Tuning survives its faults: a candidate that crashes or hangs the runner, ``kill -9``
of the tuning process, and the torn last row such a kill can leave in the database.

The faults are real: the runner's timing function, shipped by cloudpickle to MetaSchedule's
runner worker, kills that process with SIGSEGV or sleeps for an hour on chosen calls; the
killed run is a separate process sent SIGKILL.  Each test tunes one 16x32x32 GEMM with a
few trials (30-90 s each on 2 busy cores).
"""

from __future__ import annotations

import faulthandler
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

import aicf_tvm
import schedules.tuning.tasks as st
from aicf_tvm.core.errors import TuningError
from aicf_tvm.driver.cli import main
from schedules.select import RECORD_FILE, WORKLOAD_FILE, open_database
from schedules.tuning.measure import CONFIRM_ROUNDS, CONFIRM_TOP
from tests.schedules.tuning.test_tasks import gemm_model

ROOT = Path(__file__).resolve().parents[4]
TRIALS = 4
RUNNER_TIMEOUT = 10.0  # what a hung candidate costs; ample for a good one under load
LAYERS, ROWS = [(32, 32)], 16  # also given to the killed process


def model() -> tvm.IRModule:
    return gemm_model(LAYERS, rows=ROWS)


def reference(x: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(0)  # gemm_model's weights
    w = rng.standard_normal((32, 32)).astype("float32")
    b = rng.standard_normal((32,)).astype("float32")
    return np.maximum(x @ w + b, 0)


def records(work_dir: Path) -> list[bytes]:
    """The complete rows of the tuning-record file (those its newline ends)."""
    data = (work_dir / RECORD_FILE).read_bytes()
    return data[:data.rfind(b"\n") + 1].splitlines()


def runs_correctly(work_dir: Path) -> bool:
    x = np.random.default_rng(1).standard_normal((16, 32)).astype("float32")
    compiled = aicf_tvm.compile(model(), database=work_dir)
    return np.allclose(compiled(x), reference(x), rtol=1e-4, atol=1e-4)


@pytest.fixture
def watchdog():
    """Abort the test process, with every thread's traceback, if tuning hangs for good."""
    faulthandler.dump_traceback_later(900, exit=True, file=sys.__stderr__)  # minutes under load
    yield
    faulthandler.cancel_dump_traceback_later()


# --- a candidate that crashes or hangs ---------------------------------------------------------

def faulty_evaluator(log: str, faults: dict[int, str], rt_mod: Any, device: Any, config: Any,
                     repeated_args: Any) -> list[float]:
    """LocalRunner's timing function, run in its worker process: on the calls that ``faults``
    numbers (counting from 1, across worker restarts) kill the worker with SIGSEGV or hang."""
    import os
    import signal
    import time

    from tvm.s_tir.meta_schedule.runner.local_runner import default_run_evaluator

    with open(log) as f:
        call = len(f.readlines()) + 1
    fault = faults.get(call, "ok")
    with open(log, "a") as f:
        f.write(f"{fault}\n")
    if fault == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "hang":
        time.sleep(3600)
    return default_run_evaluator(rt_mod, device, config, repeated_args)


@derived_object
class RecordingRunner(ms.runner.PyRunner):
    """``inner`` (a LocalRunner, which measures inside ``run``, one candidate after the
    other) with each measurement's error message appended to ``errors`` (None: it ran)."""

    def __init__(self, inner: ms.runner.Runner, errors: list) -> None:
        super().__init__()
        self.inner, self.errors = inner, errors

    def run(self, runner_inputs: list) -> list:
        futures = self.inner.run(runner_inputs)
        self.errors.extend(f.result().error_msg for f in futures)
        return futures


@pytest.fixture
def faulty_runner(monkeypatch, tmp_path):
    """``schedules.tuning.tasks`` measures with a LocalRunner whose 6th call crashes and 7th hangs:
    the first two MetaSchedule candidates (calls 1-2 measure the seeds, 3-5 the default's
    structural neighbours); yields the worker's call log, the runner's error per
    measurement and the timeouts asked for."""
    log = tmp_path / "runner_calls.txt"
    log.write_text("")
    timeouts: list[float] = []
    errors: list[str | None] = []
    evaluator = functools.partial(faulty_evaluator, str(log), {6: "crash", 7: "hang"})

    def make_runner(timeout_s: float) -> ms.runner.Runner:
        timeouts.append(timeout_s)
        local = ms.runner.LocalRunner(timeout_sec=timeout_s, evaluator_config=st.evaluator_config(),
                                      f_run_evaluator=evaluator)
        return RecordingRunner(local, errors)

    monkeypatch.setattr(st, "make_runner", make_runner)
    module = sys.modules[__name__]  # the worker cannot import this test module: ship it by value
    cloudpickle.register_pickle_by_value(module)
    yield log, errors, timeouts
    cloudpickle.unregister_pickle_by_value(module)


def test_crashing_and_hanging_candidates_are_recorded_as_failed(faulty_runner, watchdog, tmp_path):
    """The crash and the hang cost one candidate each, in the order they came: the runner
    killed the hung worker at ``runner_timeout`` (its own message says so; the test ending
    at all says it did not wait out the hour), restarted it and measured the rest."""
    log, errors, timeouts = faulty_runner
    work_dir = tmp_path / "w"
    trials = 6  # 3 structural neighbours, then 3 searched: the crash, the hang and one more
    result = aicf_tvm.tune(model(), trials=trials, trials_per_task=trials, work_dir=work_dir,
                           runner_timeout=RUNNER_TIMEOUT, progress=False)
    calls = log.read_text().splitlines()
    confirm = ["ok"] * (CONFIRM_TOP + 1) * CONFIRM_ROUNDS  # the best records and the default, again
    assert calls == ["ok"] * 5 + ["crash", "hang", "ok"] + confirm  # went on after both, one at a time
    assert timeouts == [RUNNER_TIMEOUT]
    assert len(errors) == len(calls), errors
    assert all(errors[i] is None for i in range(len(calls)) if i not in (5, 6)), errors
    assert errors[5].startswith("LocalRunner: An exception occurred"), errors[5]
    assert errors[6] == f"LocalRunner: Timeout, killed after {RUNNER_TIMEOUT} seconds\n", errors[6]
    (task,) = result.tasks
    assert result.measured == trials and task.trials == trials - 2
    rows = records(work_dir)
    assert len(rows) == 2 + trials  # the two seeds and every candidate, in measured order
    failed = [min(json.loads(row)[1][1]) >= st.FAILED_SECS for row in rows]
    assert failed == [False] * 5 + [True, True, False]


def test_a_search_that_raises_keeps_the_task_and_the_run_goes_on(monkeypatch, tmp_path):
    """MetaSchedule's own rules raised a ``ScheduleError`` (``reverse_compute_at``) inside
    ``tune_tasks`` on Whisper's attention, and the exception ended ``aicf tune``. Now the
    task keeps what it measured before the search (its default and our rule's structural
    neighbours), the summary names the failure, and the records compile and run right."""
    def raises(**kwargs):
        raise RuntimeError("ScheduleError: An error occurred in the schedule primitive 'reverse-compute-at'.")

    monkeypatch.setattr(st.ms, "tune_tasks", raises)
    work_dir = tmp_path / "w"
    result = aicf_tvm.tune(model(), trials=TRIALS, trials_per_task=TRIALS, work_dir=work_dir, progress=False)
    (failure,) = result.search_failed
    assert "reverse-compute-at" in failure and "search failed" in result.summary()
    (task,) = result.tasks  # judged on what was measured: the default and the neighbours
    assert task.choice in ("default", "tuned")
    assert runs_correctly(work_dir)


def test_runner_timeout_must_be_positive(tmp_path):
    for bad in (0, -1.5, float("nan"), "10"):
        with pytest.raises(TuningError, match="runner_timeout="):
            aicf_tvm.tune(model(), trials=1, work_dir=tmp_path / "w", runner_timeout=bad, progress=False)
    assert not (tmp_path / "w").exists()


def test_cli_passes_runner_timeout(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr("aicf_tvm.driver.tuning.run.tune", lambda models, **kw: seen.update(kw))
    assert main(["tune", "m.onnx", "--work-dir", str(tmp_path), "--runner-timeout", "2.5"]) == 0
    assert seen["runner_timeout"] == 2.5
    assert main(["tune", "m.onnx", "--work-dir", str(tmp_path)]) == 0
    assert seen["runner_timeout"] == 60


# --- kill -9 --------------------------------------------------------------------------------------

def test_kill_9_leaves_a_database_that_loads_and_resumes(tmp_path):
    """SIGKILL once the seeds (the default schedule's records) are on disk, mid-search."""
    work_dir = tmp_path / "w"
    args = {"trials": TRIALS, "trials_per_task": TRIALS, "work_dir": str(work_dir), "progress": False}
    code = (f"import aicf_tvm\nfrom tests.schedules.tuning.test_tasks import gemm_model\n"
            f"aicf_tvm.tune(gemm_model({LAYERS!r}, rows={ROWS}), **{args!r})\n")
    with open(tmp_path / "stderr.txt", "wb") as err:
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + 300  # a guard against a run that never writes, not a timing
        while not ((work_dir / RECORD_FILE).exists() and len(records(work_dir)) >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr.txt").read_text()
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL  # killed mid-run, not finished
    finally:  # the killed run's builder and runner workers, in its session's process group
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    before = (work_dir / RECORD_FILE).read_bytes()
    assert len(open_database(work_dir)) >= 1

    again = aicf_tvm.tune(model(), **args)
    after = (work_dir / RECORD_FILE).read_bytes()
    complete = before[:before.rfind(b"\n") + 1]
    assert after.startswith(complete) and again.measured > 0
    assert len(after.splitlines()) == len(complete.splitlines()) + again.measured  # default not redone
    assert again.tasks and not again.untuned
    assert runs_correctly(work_dir)


# --- a torn last row ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("tuned")
    aicf_tvm.tune(model(), trials=2, trials_per_task=2, work_dir=work_dir, progress=False)
    return work_dir


def copy_of(work_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(work_dir, tmp_path / "copy"))


def test_torn_last_row_is_set_aside_and_tuning_resumes(tuned, tmp_path, caplog):
    """What a kill mid-append leaves: half a row, no newline.  A reader ignores it and
    changes nothing; the next tuning run moves it to ``.torn`` and appends after the rest."""
    work_dir = copy_of(tuned, tmp_path)
    path = work_dir / RECORD_FILE
    whole = path.read_bytes()
    torn = whole.splitlines()[-1][:50]
    path.write_bytes(whole + torn)

    assert len(open_database(work_dir)) == len(whole.splitlines())
    assert runs_correctly(work_dir)
    assert path.read_bytes() == whole + torn and not path.with_name(RECORD_FILE + ".torn").exists()

    with caplog.at_level(logging.WARNING, logger="schedules.select"):
        again = aicf_tvm.tune(model(), trials=4, trials_per_task=4, work_dir=work_dir, progress=False)
    assert "incomplete row" in caplog.text and ".torn" in caplog.text
    assert path.with_name(RECORD_FILE + ".torn").read_bytes() == torn + b"\n"
    after = path.read_bytes()
    assert after.startswith(whole) and again.measured == 2
    assert len(after.splitlines()) == len(whole.splitlines()) + 2
    assert runs_correctly(work_dir)


def test_whole_row_without_its_newline_is_kept(tuned, tmp_path):
    """Killed between a row and its newline: the row is complete; the newline is added."""
    work_dir = copy_of(tuned, tmp_path)
    path = work_dir / RECORD_FILE
    whole = path.read_bytes()
    path.write_bytes(whole[:-1])
    assert len(open_database(work_dir)) == len(whole.splitlines())
    assert path.read_bytes() == whole[:-1]  # a reader changes nothing
    assert len(open_database(work_dir, create=True)) == len(whole.splitlines())
    assert path.read_bytes() == whole and not path.with_name(RECORD_FILE + ".torn").exists()


@pytest.mark.parametrize("name", [RECORD_FILE, WORKLOAD_FILE])
def test_corrupt_row_before_a_torn_tail_raises_and_changes_nothing(tuned, tmp_path, name):
    """Only the unterminated last row is a torn write; a bad complete row is corruption."""
    work_dir = copy_of(tuned, tmp_path)
    path = work_dir / name
    whole = path.read_bytes()
    path.write_bytes(whole + b'[0, ["cut short\n' + whole.splitlines()[-1][:20])
    before = path.read_bytes()
    for create in (False, True):
        with pytest.raises(TuningError, match=f"{name} is corrupt at line {len(whole.splitlines()) + 1}"):
            open_database(work_dir, create=create)
    assert path.read_bytes() == before and not path.with_name(name + ".torn").exists()
