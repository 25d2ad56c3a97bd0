"""Tuning across machines: a TVM RPC tracker and two servers on 127.0.0.1, started and
stopped here, measure the candidates that ``aicf_tvm.tune(rpc=..., key=...)`` builds.

Each test really runs MetaSchedule (one 64x128x96 GEMM, 4 trials); the servers' logs
show which server timed which candidate (TVM's server logs ``load_module`` once per
measured module). Where the order of events matters, the servers are put in known states
(``rpc_server.py``: held at a gate, holding a measurement) instead of racing them.
Set ``AICF_SKIP_RPC=1`` where local sockets are unavailable.
"""

from __future__ import annotations

import contextlib
import json
import logging
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
from aicf_tvm.core.errors import TuningError
from schedules.tuning.measure import CONFIRM_ROUNDS, CONFIRM_TOP
from schedules.tuning.remote import Tracker, is_lost_server
from tests.schedules.tuning.test_tasks import gemm_model

pytestmark = pytest.mark.skipif(os.environ.get("AICF_SKIP_RPC") == "1", reason="AICF_SKIP_RPC=1")
pytest.importorskip("tornado", reason="TVM's RPC tracker needs tornado (pip install -e '.[test]')")

TRIALS = 4
CONFIRMING = (CONFIRM_TOP + 1) * CONFIRM_ROUNDS  # measurements of the final side-by-side check
HOST = "127.0.0.1"
START_TIMEOUT_S = 120  # a guard against a process that never comes up, not a timing
SERVER = Path(__file__).with_name("rpc_server.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


class Process:
    """A Python subprocess (TVM's tracker, a server) in its own process group, logging to a file."""

    def __init__(self, log: Path, target: str, *args: str) -> None:
        """``target``: a module (``python -m``) or a script's path."""
        self.log = log
        command = [sys.executable, target] if target.endswith(".py") else [sys.executable, "-m", target]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([*command, *args], stdout=out, stderr=subprocess.STDOUT,
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


class Cluster:
    """A tracker on a free port and the servers added under ``key``."""

    def __init__(self, tmp_path: Path, key: str) -> None:
        self.tmp_path, port = tmp_path, free_port()
        self.procs = [Process(tmp_path / "tracker.log", "tvm.exec.rpc_tracker", "--host", HOST, "--port", str(port),
                              "--port-end", str(port + 1))]
        self.tracker = Tracker(HOST, port, key)

        def answers() -> bool:
            try:
                socket.create_connection((HOST, port), timeout=1).close()
                return True
            except OSError:  # not listening yet
                return self.procs[0].proc.poll() is not None and _raise(self.procs[0])

        wait_for(answers, "RPC tracker")

    def add_server(self, name: str, *options: str) -> Process:
        """TVM's server, or with ``options`` (``--gate FILE``, ``--hold-loads``) ours that
        can be held in a known state (``tests/schedules/tuning/rpc_server.py``)."""
        port = free_port()
        proc = Process(self.tmp_path / f"{name}.log", str(SERVER) if options else "tvm.exec.rpc_server",
                       "--host", HOST, "--port", str(port), "--port-end", str(port + 1),
                       "--tracker", f"{HOST}:{self.tracker.port}", "--key", self.tracker.key, *options)
        self.procs.append(proc)
        return proc

    def wait_registered(self, count: int) -> None:
        wait_for(lambda: self.tracker.servers() == count, f"{count} RPC server(s) registered")

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.kill()


@contextlib.contextmanager
def cluster(tmp_path: Path, key: str, servers: int = 0) -> Iterator[Cluster]:
    """A tracker and ``servers`` plain servers registered under ``key``; all killed on exit."""
    c = Cluster(tmp_path, key)
    try:
        for i in range(servers):
            c.add_server(f"server{i}")
        c.wait_registered(servers)
        yield c
    finally:
        c.close()


def records(work_dir: Path) -> list[list]:
    return [json.loads(line) for line in (work_dir / "database_tuning_record.json").read_text().splitlines()]


def run_secs(record: list) -> float:
    secs = record[1][1]
    return sum(secs) / len(secs)


def test_tunes_across_two_servers(tmp_path):
    with cluster(tmp_path, "e9-two", servers=2) as c:
        tracker = c.tracker
        with pytest.raises(TuningError, match="no RPC server is registered under key 'other'"):
            aicf_tvm.tune(gemm_model([(128, 96)]), trials=1, work_dir=tmp_path / "w", progress=False,
                          rpc=f"{tracker.host}:{tracker.port}", key="other")
        result = aicf_tvm.tune(gemm_model([(128, 96)]), trials=TRIALS, trials_per_task=TRIALS,
                               work_dir=tmp_path / "work", progress=False,
                               rpc=f"{tracker.host}:{tracker.port}", key=tracker.key)
        measured = [s.measured() for s in c.procs[1:]]
    (task,) = result.tasks
    assert "rpc" in result.measured_on and "2 server(s)" in result.measured_on
    assert task.trials == TRIALS and task.default_s is not None
    recs = records(tmp_path / "work")
    assert len(recs) == TRIALS + 2 and all(run_secs(r) < 1e9 for r in recs)
    # every record was timed by a server (the two seeds, then the candidates), and so were
    # the best records and the default, measured again side by side
    assert sum(measured) == TRIALS + 2 + CONFIRMING, measured
    assert all(n >= 1 for n in measured), measured


def test_losing_a_server_midway_loses_no_record(tmp_path, caplog):
    """The order is forced, not raced. The doomed server is the only one registered when
    the first measurement (the default schedule's) starts, and it holds that measurement in
    ``load_module`` until it is killed; the survivor, started and waiting at its gate, only
    registers then; the doomed server is killed once it has. So that measurement is lost
    with its server and must be measured again on the survivor, which measures all the rest."""
    gate = tmp_path / "survivor.gate"
    with cluster(tmp_path, "e9-kill") as c:
        doomed = c.add_server("doomed", "--hold-loads")
        c.wait_registered(1)
        survivor = c.add_server("survivor", "--gate", str(gate))
        wait_for(lambda: "waiting at the gate" in survivor.text(), "the survivor at its gate")

        outcome: dict = {}

        def tune() -> None:
            try:
                outcome["result"] = aicf_tvm.tune(
                    gemm_model([(128, 96)]), trials=TRIALS, trials_per_task=TRIALS, work_dir=tmp_path / "work",
                    progress=False, rpc=f"{c.tracker.host}:{c.tracker.port}", key=c.tracker.key)
            except BaseException as err:  # noqa: BLE001 - re-raised below, in the test's thread
                outcome["error"] = err

        tuning = threading.Thread(target=tune, daemon=True)
        with caplog.at_level(logging.WARNING, logger="schedules.tuning.remote"):
            tuning.start()
            wait_for(lambda: doomed.measured() == 1 or not tuning.is_alive(),
                     "the first measurement on the doomed server", timeout_s=300)
            assert tuning.is_alive(), outcome
            assert survivor.measured() == 0 and c.tracker.servers() == 1
            gate.touch()
            c.wait_registered(2)
            doomed.kill()  # mid-measurement: it holds it until now
            tuning.join(timeout=600)
        assert not tuning.is_alive(), "tuning did not finish after the kill"
        if "error" in outcome:
            raise outcome["error"]
        assert c.tracker.servers() == 1
        held, survived = doomed.measured(), survivor.measured()
    lost = [r for r in caplog.records if "measurement lost with its RPC server" in r.getMessage()]
    assert len(lost) == 1, [r.getMessage() for r in caplog.records]
    assert held == 1  # the default schedule's, never finished
    assert survived == TRIALS + 2 + CONFIRMING  # that one again, the other seed, every candidate, the re-measuring
    (task,) = outcome["result"].tasks
    recs = records(tmp_path / "work")
    assert task.trials == TRIALS and task.default_s is not None
    assert len(recs) == TRIALS + 2 and all(run_secs(r) < 1e9 for r in recs)


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
