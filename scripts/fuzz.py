"""Differential fuzzing for longer than the test suite does; every failure becomes a test.

    python scripts/fuzz.py --minutes 30 [--seed 0] [--examples-per-seed 40]

Runs the property of ``tests/fuzz/test_differential.py`` (our compiled module vs TVM's
default build and numpy) over seeds S, S+1, ... until the time is up. Hypothesis shrinks
each failure; the shrunk module is written as a self-contained pytest file under
``tests/regressions/`` (the module as TVMScript with its constants, the inputs' seed and
shapes, the oracle), one file per distinct failure. A summary line per seed goes to
stdout, and a final line with the seed range, example count and failure count.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import os
import pickle
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("AICF_DEBUG", "1")

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import Flaky, UnsatisfiedAssumption

from tests.fuzz.program import build_module, random_inputs
from tests.fuzz.strategies import programs
from tests.fuzz.test_differential import check_program

REGRESSIONS = ROOT / "tests" / "regressions"

TEMPLATE = '''"""Fuzz regression {name}: {summary}

Found by {found_by}; the shrunk program:

{program}
"""

import numpy as np
import tvm

from tests.fuzz.check import check_module

SOURCE = {source}

INPUTS = {inputs!r}  # (shape, dtype) of each input, filled from default_rng(0)
DTYPES = {dtypes!r}


def test_{name}() -> None:
    mod = tvm.script.from_source(SOURCE)
    rng = np.random.default_rng(0)
    inputs = [np.asarray(rng.standard_normal(shape)).astype(dtype) for shape, dtype in INPUTS]
    check_module(mod, inputs, set(DTYPES))
'''


def write_regression(prog, err: BaseException, seed_value: int, found_by: str | None = None) -> Path | None:
    try:
        mod = build_module(prog)
    except Exception as build_err:  # noqa: BLE001 - a generator bug: report it, keep fuzzing
        print(f"seed {seed_value}: the program itself does not build ({build_err}); not written:\n{prog!r}",
              flush=True)
        return None
    source = mod.script(show_meta=True)
    digest = hashlib.sha1(source.encode()).hexdigest()[:10]
    name = f"fuzz_{digest}"
    path = REGRESSIONS / f"test_{name}.py"
    if path.exists():
        return None
    inputs = [(list(a.shape), str(a.dtype)) for a in random_inputs(prog)]
    dtypes = sorted({dt for _, dt in prog.inputs} | {s.params.get("dtype", "") for s in prog.steps} - {""})
    summary = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:160] if str(err).strip() else ''}"
    REGRESSIONS.mkdir(parents=True, exist_ok=True)
    (REGRESSIONS / "__init__.py").touch()
    literal = f"r'''{source}'''" if "'''" not in source and not source.endswith("\\") else repr(source)
    found_by = found_by or f"``scripts/fuzz.py --seed {seed_value}``"
    path.write_text(TEMPLATE.format(name=name, summary=summary, found_by=found_by, source=literal,
                                    program=textwrap.indent(repr(prog), "    "),
                                    inputs=inputs, dtypes=dtypes))
    return path


def run_seed(seed_value: int, examples: int) -> tuple[int, list]:
    """Run one seed; returns (examples run, [(program, error)] for the shrunk failures)."""
    state = {"count": 0, "last": None}

    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
              phases=[Phase.generate, Phase.target, Phase.shrink])  # explain traces every line: hours
    @seed(seed_value)
    @given(programs())
    def prop(prog) -> None:
        state["count"] += 1
        try:
            check_program(prog)
        except UnsatisfiedAssumption:
            raise
        except BaseException as err:
            state["last"] = (prog, err)
            raise

    try:
        prop()
    except Flaky as err:
        return state["count"], [(state["last"][0], err)] if state["last"] else []
    except Exception:  # noqa: BLE001 - hypothesis re-raises the shrunk failure last
        return state["count"], [state["last"]] if state["last"] else []
    return state["count"], []


class ProcessCrashed(Exception):
    """The compiler aborted the whole process (a fatal error inside TVM)."""


def one_seed(seed_value: int, examples: int) -> None:
    """Child process: run one seed, write its regressions, print a JSON summary line."""
    if os.environ.get("AICF_FUZZ_STACKS"):
        faulthandler.dump_traceback_later(float(os.environ["AICF_FUZZ_STACKS"]), repeat=True)
    n, fails = run_seed(seed_value, examples)
    paths = []
    for prog, err in fails:
        path = write_regression(prog, err, seed_value)
        print(f"seed {seed_value}: FAIL {type(err).__name__}: {str(err).strip()[:300]} -> {path or 'known'}",
              flush=True)
        paths.append(str(path))
    print("RESULT " + json.dumps({"examples": n, "failures": len(fails)}), flush=True)


def spawn_seed(seed_value: int, examples: int, trace: Path) -> tuple[int, int]:
    """Run a seed in a child, so that a process abort inside TVM is a failure, not the end.
    A crash is written as a regression from the last program the child started (unshrunk)."""
    cmd = [sys.executable, __file__, "--one-seed", str(seed_value), "--examples-per-seed", str(examples)]
    env = dict(os.environ, AICF_FUZZ_TRACE=str(trace))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            data = json.loads(line[7:])
            return data["examples"], data["failures"]
        print(line, flush=True)
    prog = pickle.loads(trace.read_bytes())
    tail = proc.stderr.strip().splitlines()[-3:]
    path = write_regression(prog, ProcessCrashed(f"exit {proc.returncode}: {' | '.join(tail)}"), seed_value)
    print(f"seed {seed_value}: CRASH exit {proc.returncode} -> {path or 'known'}", flush=True)
    return 0, 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0, help="first seed; later ones count up")
    ap.add_argument("--examples-per-seed", type=int, default=40)
    ap.add_argument("--one-seed", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one_seed is not None:
        one_seed(args.one_seed, args.examples_per_seed)
        return 0
    deadline = time.monotonic() + args.minutes * 60
    total, failures, s = 0, 0, args.seed
    start = time.monotonic()
    trace = Path(tempfile.mkdtemp(prefix="aicf_fuzz_")) / "last.pkl"
    while time.monotonic() < deadline:
        n, nfail = spawn_seed(s, args.examples_per_seed, trace)
        total += n
        failures += nfail
        print(f"seed {s}: {n} examples, {nfail} failures ({(time.monotonic() - start) / 60:.1f} min)",
              flush=True)
        s += 1
    print(f"fuzz: seeds {args.seed}..{s - 1}, {total} examples, {failures} failures, "
          f"{(time.monotonic() - start) / 60:.1f} minutes", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
