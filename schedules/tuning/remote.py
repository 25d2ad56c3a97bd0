"""Measuring tuning candidates on remote machines through TVM's RPC tracker (docs/design.md §7).

TVM ships the distributed engine: a tracker (``python -m tvm.exec.rpc_tracker``) that
hands out sessions on the servers registered with it under a key (``python -m
tvm.exec.rpc_server --tracker HOST:PORT --key KEY``), and MetaSchedule's ``RPCRunner``,
which uploads each built candidate to one such session and times it there.  Candidates
are still built here, by the local builder; only measurement goes remote.

``RemoteRunner`` adds one thing to ``RPCRunner``: a measurement that failed because its
server went away (killed, rebooted, network lost) is measured again on another server
instead of being recorded as a failed candidate, so losing a server midway loses no
record.  A candidate that fails on a live server (a real build or run error, a timeout) is
not retried; one that crashes its session process looks like a lost server and is tried
``retries`` more times (each server forks a process per session, so it survives that).
Imports only TVM and the standard library.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from aicf_tvm.core.errors import TuningError

_LOG = logging.getLogger(__name__)

# Messages of an RPC session that ended because the server (or the link to it) went away.
_LOST_SERVER = (
    "code=kshutdown",  # the server's session process died mid-call
    "connection reset", "connection refused", "connection aborted", "broken pipe", "socket closed",
    "failed to connect", "cannot recv", "cannot send",
)


class RemoteError(TuningError, RuntimeError):
    """The tracker cannot be reached or has no server under the key; the message says which."""


@dataclass(frozen=True)
class Tracker:
    """Where to measure: the tracker's address and the key its servers registered under."""

    host: str
    port: int
    key: str
    session_timeout_s: int = 60  # upload, link (g++ on the server) and timing of one candidate

    @classmethod
    def parse(cls, address: str, key: str) -> Tracker:
        """``"HOST:PORT"`` and a non-empty key, or ``RemoteError``."""
        host, sep, port = str(address).rpartition(":")
        if not sep or not host or not port.isdigit():
            raise RemoteError(f"rpc address {address!r}: expected HOST:PORT, e.g. 127.0.0.1:9190")
        if not key:
            raise RemoteError("rpc: a tracker needs --key, the key the servers registered under")
        return cls(host, int(port), str(key))

    def config(self) -> ms.runner.RPCConfig:
        return ms.runner.RPCConfig(tracker_host=self.host, tracker_port=self.port, tracker_key=self.key,
                                   session_timeout_sec=self.session_timeout_s)

    def servers(self) -> int:
        """Servers now registered under the key (free or busy), or ``RemoteError``."""
        try:  # TVM's own client retries a refused connection for a minute: probe first
            socket.create_connection((self.host, self.port), timeout=10).close()
            summary = self.config().connect_tracker().summary()
        except Exception as err:
            raise RemoteError(
                f"no RPC tracker answers at {self.host}:{self.port} ({type(err).__name__}); start one "
                f"with `python -m tvm.exec.rpc_tracker --host {self.host} --port {self.port}`") from err
        return sum(1 for s in summary.get("server_info", []) if s.get("key") == f"server:{self.key}")


def is_lost_server(error: str) -> bool:
    """Whether an ``RPCRunner`` error says the session died rather than the candidate."""
    text = error.lower()
    return text.startswith("rpcrunner:") and any(word in text for word in _LOST_SERVER)


@derived_object
class _RetryFuture(ms.runner.PyRunnerFuture):
    def __init__(self, runner: RemoteRunner, runner_input: Any, future: Any) -> None:
        super().__init__()
        self.runner, self.input, self.future = runner, runner_input, future

    def done(self) -> bool:
        return self.future.done()

    def result(self) -> Any:
        result = self.future.result()
        for _ in range(self.runner.retries):
            if not result.error_msg or not is_lost_server(str(result.error_msg)):
                break
            self.runner.retried += 1
            _LOG.warning("measurement lost with its RPC server, measuring again: %s",
                         str(result.error_msg).strip().splitlines()[-1][:200])
            (self.future,) = self.runner.inner.run([self.input])
            result = self.future.result()
        return result


@derived_object
class RemoteRunner(ms.runner.PyRunner):
    """``RPCRunner`` on the tracker's servers, with up to ``retries`` new sessions for a
    measurement whose server was lost; ``workers`` sessions run at once."""

    def __init__(self, tracker: Tracker, workers: int, evaluator_config: Any = None, retries: int = 2) -> None:
        super().__init__()
        self.tracker = tracker
        self.retries = retries
        self.retried = 0  # measurements started again after a lost server
        self.inner = ms.runner.RPCRunner(tracker.config(), evaluator_config, max_workers=max(1, workers))

    def run(self, runner_inputs: list[Any]) -> list[Any]:
        futures = self.inner.run(runner_inputs)
        return [_RetryFuture(self, i, f) for i, f in zip(runner_inputs, futures)]
