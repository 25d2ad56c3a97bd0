"""Models run with every CPU the process may use, not TVM's hardware_concurrency / 2.

TVM's pool is per calling thread and keeps the worker count it started with, so each
case runs in a fresh interpreter (the default) or a fresh Python thread inside one, and
reads the count from the runtime itself (``runtime.NumThreads``) after a call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tvm import relax

import aicf_tvm
from aicf_tvm import InputError
from aicf_tvm.runtime.threads import available_cpus, thread_count

CPUS = len(available_cpus())
REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(CPUS < 2, reason="one CPU: every default is one thread")

# Each case: a callable run on its own thread, after which the thread's count is read.
SCRIPT = r"""
import json, sys, threading
import numpy as np, tvm_ffi
import aicf_tvm

lib, x = sys.argv[1], np.load(sys.argv[2])
counts = {}

def case(name, run):
    def body():
        run()
        counts[name] = int(tvm_ffi.get_global_func("runtime.NumThreads")())
    t = threading.Thread(target=body)
    t.start()
    t.join()

def cli(*extra):
    from aicf_tvm.driver.cli import main
    assert main(["run", lib, "--input", "x=" + sys.argv[2], *extra]) == 0

# the main thread first: the process's first pool
aicf_tvm.load(lib)(x)
counts["load"] = int(tvm_ffi.get_global_func("runtime.NumThreads")())
case("load_threads_1", lambda: aicf_tvm.load(lib, threads=1)(x))
case("load_threads_3", lambda: aicf_tvm.load(lib, threads=3)(x))
case("cli", cli)
case("cli_threads_1", lambda: cli("--threads", "1"))
if sys.argv[3:] == ["compile"]:
    from aicf_tvm.driver.models import BUILTIN_MODELS
    mod = BUILTIN_MODELS["encoder_layer_small"]()
    case("compile", lambda: aicf_tvm.compile(mod)(x))
    case("compile_num_cores_1",
         lambda: aicf_tvm.compile(mod, target={"kind": "llvm", "num-cores": 1})(x))
    case("compile_threads_1", lambda: aicf_tvm.compile(mod, threads=1)(x))
print(json.dumps(counts))
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> tuple[Path, Path]:
    from aicf_tvm.driver.models import BUILTIN_MODELS

    out = tmp_path_factory.mktemp("threads")
    path = aicf_tvm.compile(BUILTIN_MODELS["encoder_layer_small"]()).export(out / "small.so")
    x = out / "x.npy"
    np.save(x, np.random.default_rng(0).standard_normal((1, 16, 64)).astype(np.float32))
    return path, x


def counts_in_fresh_process(library: tuple[Path, Path], *extra: str, **env: str) -> dict[str, int]:
    clean = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    clean.update(env, PYTHONPATH=str(REPO), AICF_DEBUG="0")
    done = subprocess.run([sys.executable, "-c", SCRIPT, *map(str, library), *extra], env=clean,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_default_is_every_usable_cpu_and_overrides_win(library):
    counts = counts_in_fresh_process(library, "compile")
    assert counts == {
        "load": CPUS, "load_threads_1": 1, "load_threads_3": 3, "cli": CPUS, "cli_threads_1": 1,
        "compile": CPUS, "compile_num_cores_1": 1, "compile_threads_1": 1,
    }


def test_tvm_num_threads_overrides_the_default_and_threads_overrides_it(library):
    counts = counts_in_fresh_process(library, TVM_NUM_THREADS="1")
    assert counts == {"load": 1, "load_threads_1": 1, "load_threads_3": 3, "cli": 1, "cli_threads_1": 1}


def test_threaded_and_single_threaded_runs_match_numpy():
    """A parallel row loop (softmax over rows) on every CPU and on one."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((256, 512), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.softmax(x, axis=-1)))
        bb.emit_func_output(out)
    data = np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32)
    shifted = np.exp(data.astype(np.float64) - data.max(-1, keepdims=True))
    expected = shifted / shifted.sum(-1, keepdims=True)
    for threads in (1, CPUS):
        np.testing.assert_allclose(aicf_tvm.compile(bb.get(), threads=threads)(data), expected,
                                   rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("threads, env, culprit", [
    (0, None, "threads=0: expected a positive number of threads"),
    (2.5, None, "threads=2.5"),
    (None, "many", "TVM_NUM_THREADS='many'"),
    (None, "-1", "TVM_NUM_THREADS='-1'"),
])
def test_bad_thread_counts_are_input_errors(monkeypatch, threads, env, culprit):
    if env is not None:
        monkeypatch.setenv("TVM_NUM_THREADS", env)
    with pytest.raises(InputError, match=culprit.replace(".", r"\.")):
        thread_count(threads)


def test_target_num_cores_caps_the_default(monkeypatch):
    monkeypatch.delenv("TVM_NUM_THREADS", raising=False)
    assert thread_count(None, {"kind": "llvm", "num-cores": 1}) == 1
    assert thread_count(None, {"kind": "llvm", "num-cores": 4 * CPUS}) == CPUS
    assert thread_count(None, {"kind": "cuda"}) == CPUS
