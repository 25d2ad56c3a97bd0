"""Tuning across machines: a TVM RPC tracker and two servers on 127.0.0.1, started and
stopped here, measure the candidates that ``aicf_tvm.tune(rpc=..., key=...)`` builds.

Each test really runs MetaSchedule (one 64x128x96 GEMM, 4 trials); the servers' logs
show which server timed which candidate (TVM's server logs ``load_module`` once per
measured module).  Set ``AICF_SKIP_RPC=1`` where local sockets are unavailable.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import aicf_tvm
from aicf_tvm.errors import TuningError
from schedules.remote import Tracker, is_lost_server
from tests.schedules.test_tune import gemm_model

pytestmark = pytest.mark.skipif(os.environ.get("AICF_SKIP_RPC") == "1", reason="AICF_SKIP_RPC=1")
pytest.importorskip("tornado", reason="TVM's RPC tracker needs tornado (pip install -e '.[test]')")

TRIALS = 4
HOST = "127.0.0.1"
START_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


class Process:
    """A ``python -m tvm.exec.*`` subprocess in its own process group, logging to a file."""

    def __init__(self, log: Path, *args: str) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def measured(self) -> int:
        return self.text().count("load_module")

    def kill(self) -> None:
        """SIGKILL the whole group: the server forks a child per session."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


def wait_for(predicate, what: str, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {timeout_s} s")
        time.sleep(0.2)


def _raise(proc: Process) -> bool:
    raise RuntimeError(f"{proc.log.name} exited: {proc.text()[-500:]}")


@contextlib.contextmanager
def cluster(tmp_path: Path, key: str, servers: int = 2) -> Iterator[tuple[Tracker, list[Process]]]:
    """A tracker and ``servers`` servers registered under ``key``; all killed on exit."""
    port = free_port()
    procs = [Process(tmp_path / "tracker.log", "tvm.exec.rpc_tracker", "--host", HOST, "--port", str(port),
                     "--port-end", str(port + 1))]
    try:
        tracker = Tracker(HOST, port, key)

        def answers() -> bool:
            try:
                socket.create_connection((HOST, port), timeout=1).close()
                return True
            except OSError:  # not listening yet
                return procs[0].proc.poll() is not None and _raise(procs[0])

        wait_for(answers, "RPC tracker")
        for i in range(servers):
            server_port = free_port()
            procs.append(Process(tmp_path / f"server{i}.log", "tvm.exec.rpc_server", "--host", HOST,
                                 "--port", str(server_port), "--port-end", str(server_port + 1),
                                 "--tracker", f"{HOST}:{port}", "--key", key))
        wait_for(lambda: tracker.servers() == servers, f"{servers} RPC servers")
        yield tracker, procs[1:]
    finally:
        for proc in reversed(procs):
            proc.kill()


def records(work_dir: Path) -> list[list]:
    return [json.loads(line) for line in (work_dir / "database_tuning_record.json").read_text().splitlines()]


def run_secs(record: list) -> float:
    secs = record[1][1]
    return sum(secs) / len(secs)


def test_tunes_across_two_servers(tmp_path):
    with cluster(tmp_path, "e9-two") as (tracker, servers):
        with pytest.raises(TuningError, match="no RPC server is registered under key 'other'"):
            aicf_tvm.tune(gemm_model([(128, 96)]), trials=1, work_dir=tmp_path / "w", progress=False,
                          rpc=f"{tracker.host}:{tracker.port}", key="other")
        result = aicf_tvm.tune(gemm_model([(128, 96)]), trials=TRIALS, trials_per_task=TRIALS,
                               work_dir=tmp_path / "work", progress=False,
                               rpc=f"{tracker.host}:{tracker.port}", key=tracker.key)
        measured = [s.measured() for s in servers]
    (task,) = result.tasks
    assert "rpc" in result.measured_on and "2 server(s)" in result.measured_on
    assert task.trials == TRIALS and task.default_s is not None
    recs = records(tmp_path / "work")
    assert len(recs) == TRIALS + 1 and all(run_secs(r) < 1e9 for r in recs)
    # every record was timed by a server: the default, then the searched candidates
    assert sum(measured) == TRIALS + 1, measured
    assert all(n >= 1 for n in measured), measured


def test_losing_a_server_midway_loses_no_record(tmp_path):
    with cluster(tmp_path, "e9-kill") as (tracker, (doomed, survivor)):
        def kill_on_first_measurement() -> None:
            with contextlib.suppress(TimeoutError):
                wait_for(lambda: doomed.measured() > 0, "first measurement", timeout_s=300)
                doomed.kill()

        killer = threading.Thread(target=kill_on_first_measurement, daemon=True)
        killer.start()
        result = aicf_tvm.tune(gemm_model([(128, 96)]), trials=TRIALS, trials_per_task=TRIALS,
                               work_dir=tmp_path / "work", progress=False,
                               rpc=f"{tracker.host}:{tracker.port}", key=tracker.key, workers=2)
        killer.join(timeout=30)
        assert doomed.proc.poll() is not None  # it was killed while tuning ran
        assert tracker.servers() == 1
        survived = survivor.measured()
    (task,) = result.tasks
    recs = records(tmp_path / "work")
    assert task.trials == TRIALS and task.default_s is not None
    assert len(recs) == TRIALS + 1 and all(run_secs(r) < 1e9 for r in recs)
    assert survived >= TRIALS  # all the search's candidates, and maybe the default too


def test_unreachable_tracker_and_bad_address_are_clear_errors(tmp_path):
    with pytest.raises(TuningError, match="no RPC tracker answers"):
        aicf_tvm.tune(gemm_model([(128, 96)]), trials=1, work_dir=tmp_path / "w", progress=False,
                      rpc=f"{HOST}:{free_port()}", key="k")
    with pytest.raises(TuningError, match="expected HOST:PORT"):
        aicf_tvm.tune(gemm_model([(128, 96)]), trials=1, work_dir=tmp_path / "w", rpc="nohost", key="k")
    with pytest.raises(TuningError, match="need rpc"):
        aicf_tvm.tune(gemm_model([(128, 96)]), trials=1, work_dir=tmp_path / "w", key="k")


def test_only_errors_of_a_lost_session_are_retried():
    assert is_lost_server("RPCRunner: An exception occurred\nConnectionResetError: [Errno 104] Connection reset")
    assert is_lost_server("RPCRunner: An exception occurred\nInternalError: Check failed: (code == "
                          "RPCCode::kReturn) is false: code=kShutdown")
    assert not is_lost_server("RPCRunner: Timeout, killed after 60 seconds")
    assert not is_lost_server("RPCRunner: An exception occurred\nInternalError: Check failed: index out of range")
    assert not is_lost_server("LocalRunner: An exception occurred\nConnection reset")
