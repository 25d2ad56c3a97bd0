"""Child processes that build and run modules, so that an abort inside TVM is a failure
the fuzzer reports, not the end of the fuzzer.

``Worker`` keeps one child (``python -m tests.fuzz.worker``) and sends it requests over
its stdin/stdout as pickles: the module as ``tvm.ir.save_json`` text plus the input
arrays, and which build to run (``reference`` or ``ours``). The child answers with the
flattened outputs or the exception it caught. When the child dies (abort, segfault) or
does not answer in time, the request fails with ``FuzzFailure("crash" / "timeout")``
(``ReferenceFailed`` for the reference build), naming the exit signal and the last lines
the child wrote to stderr, and the next request starts a new child. ``Pair`` runs the
reference in one worker and ours in another, at the same time.
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import BinaryIO

import numpy as np
import tvm

from .check import FuzzFailure, ReferenceFailed, run_ours, run_reference

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600.0


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


class Worker:
    """One child process at a time; restarted after it dies. Not thread-safe."""

    def __init__(self, timeout_s: float = TIMEOUT_S, command: list[str] | None = None) -> None:
        self.timeout_s = timeout_s
        self.command = command or [sys.executable, "-m", "tests.fuzz.worker"]
        self._proc: subprocess.Popen | None = None
        self._since = 0  # the log's size when the pending request was sent
        fd, name = tempfile.mkstemp(prefix="aicf_fuzz_worker_", suffix=".log")
        os.close(fd)
        self._log = Path(name)  # the child's stderr, appended to

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        with self._log.open("ab") as log:
            return subprocess.Popen(self.command, cwd=ROOT, env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)

    def _stderr_tail(self, since: int, lines: int = 6) -> str:
        with self._log.open("rb") as log:
            log.seek(since)
            text = log.read().decode(errors="replace").strip().splitlines()
        return " | ".join(line.strip() for line in text[-lines:] if line.strip())

    def start(self) -> None:
        """Start a child unless one is alive (it imports TVM, ~5 s, while the caller goes on)."""
        if self._proc is None or self._proc.poll() is not None:
            self._proc = self._start()

    def send(self, which: str, mod: tvm.IRModule, inputs: list[np.ndarray]) -> None:
        """Start one request (``receive`` collects it)."""
        self.start()
        self._since = self._log.stat().st_size
        try:
            pickle.dump((which, tvm.ir.save_json(mod), inputs), self._proc.stdin)
            self._proc.stdin.flush()
        except BrokenPipeError:
            pass  # the child died at start-up: receive reports it

    def receive(self) -> tuple:
        """("ok", outputs), ("error", message, ""), or ("crash" / "timeout", what, stderr tail)."""
        proc, since = self._proc, self._since
        try:
            ready, _, _ = select.select([proc.stdout], [], [], self.timeout_s)
            if not ready:
                self.close()
                return ("timeout", f"no answer in {self.timeout_s:.0f} s", self._stderr_tail(since))
            return pickle.load(proc.stdout)
        except (EOFError, pickle.UnpicklingError):
            code = proc.wait()
            self.close()
            return ("crash", _exit_reason(code), self._stderr_tail(since))

    def ours(self, mod: tvm.IRModule, inputs: list[np.ndarray]) -> list[np.ndarray]:
        self.send("ours", mod, inputs)
        return _ours_result(self.receive())

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            self._proc.stdin.close()
            self._proc.stdout.close()
            self._proc = None

    def discard(self) -> None:
        """Stop the child and delete its log."""
        self.close()
        self._log.unlink(missing_ok=True)


def _reference_result(reply: tuple) -> list[np.ndarray]:
    if reply[0] != "ok":
        raise ReferenceFailed(f"{reply[0]}: {reply[1]} {reply[2]}".strip())
    return reply[1]


def _ours_result(reply: tuple) -> list[np.ndarray]:
    if reply[0] == "ok":
        return reply[1]
    kind, what, detail = reply
    raise FuzzFailure(kind, f"{what}: {detail}" if detail else what)


class Pair:
    """Two workers, so that the reference and ours build at the same time (and an abort in
    either ends only its own child)."""

    def __init__(self, timeout_s: float = TIMEOUT_S) -> None:
        self.ref, self.mine = Worker(timeout_s), Worker(timeout_s)

    def start(self) -> None:
        self.ref.start()
        self.mine.start()

    def both(self, mod: tvm.IRModule, inputs: list[np.ndarray]) -> tuple[list, list]:
        self.ref.send("reference", mod, inputs)
        self.mine.send("ours", mod, inputs)
        ref, ours = self.ref.receive(), self.mine.receive()
        return _reference_result(ref), _ours_result(ours)

    def discard(self) -> None:
        self.ref.discard()
        self.mine.discard()


_SHARED: Pair | None = None


def shared() -> Pair:
    """This process's pair of workers (started on first use, stopped at exit)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = Pair()
        atexit.register(_SHARED.discard)
    return _SHARED


def _serve(requests: BinaryIO, replies: BinaryIO) -> None:
    run = {"reference": run_reference, "ours": run_ours}
    while True:
        try:
            which, text, inputs = pickle.load(requests)
        except EOFError:
            return
        try:
            reply: tuple = ("ok", run[which](tvm.ir.load_json(text), inputs))
        except ReferenceFailed as err:
            reply = ("error", str(err), "")
        except Exception as err:  # noqa: BLE001 - sent back to the parent to judge
            reply = ("error", f"{type(err).__name__}: {str(err).strip()[:2000]}", "")
        pickle.dump(reply, replies)
        replies.flush()


if __name__ == "__main__":
    # Replies go on a private copy of stdout; anything TVM prints lands on stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _serve(sys.stdin.buffer, out)
