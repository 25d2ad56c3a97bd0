"""Differential fuzzing for longer than the test suite does; every new failure becomes a test.

    python -m scripts.fuzz --minutes 30 [--seed 0] [--profile realistic|small|all]
    python -m scripts.fuzz --stats [--profile ci|realistic|small|all] [--count 200]

Run it from the repository root, as a module: its engine is the package ``tests.fuzz``
(generators, oracle, known bugs), the same code the test suite runs. It runs the property
of ``tests/fuzz/test_differential.py`` (our compiled module vs TVM's default build and
numpy, both built in a worker process so that an abort is a failure) under hypothesis,
over seeds S, S+1, ... until the time is up. A failure that matches
``tests/fuzz/known_bugs.py`` is counted under its bug's name and not shrunk; any other is
shrunk (for at most ``--shrink-minutes``) and written as a self-contained pytest file
under ``tests/regressions/`` (the module as TVMScript with its constants, the inputs'
shapes, the oracle). The end of the run prints the examples run, the failures by known
bug, the new ones, and the size histogram of the programs run. ``--stats`` only lists
what a profile draws (``ci``: exactly the cases the test suite runs).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("AICF_DEBUG", "1")

from hypothesis import HealthCheck, Phase, given, seed, settings

from tests.fuzz.check import FuzzFailure, ReferenceFailed, check_program
from tests.fuzz.known_bugs import known_bug
from tests.fuzz.program import Program
from tests.fuzz.relax_build import build_module
from tests.fuzz.stats import Stats, stats_of
from tests.fuzz.strategies import CI_CASES, PROFILES, draw_program, programs
from tests.fuzz.worker import shared

REGRESSIONS = ROOT / "tests" / "regressions"

TEMPLATE = '''"""Fuzz regression {name}: {summary}

Found by {found_by}; the shrunk program:

{program}
"""

import tvm

from tests.fuzz.check import check_module
from tests.fuzz.numpy_eval import eval_numpy
from tests.fuzz.program import Program, random_inputs
{worker_import}
SOURCE = {source}

# the program itself: its inputs (drawn from default_rng(0)), its dtypes, and its numpy
# meaning, the oracle beside TVM's build, as in the fuzz run
PROGRAM = Program.from_json({program_json})


def test_{name}() -> None:
    mod = tvm.script.from_source(SOURCE)
    inputs = random_inputs(PROGRAM)
    check_module(mod, inputs, PROGRAM.dtypes(), eval_numpy(PROGRAM, inputs){runner})
'''


def write_regression(prog: Program, err: FuzzFailure, found_by: str) -> Path | None:
    """The failure as a test file; None when the same module already has one."""
    source = build_module(prog).script(show_meta=True)
    name = f"fuzz_{hashlib.sha1(source.encode()).hexdigest()[:10]}"
    path = REGRESSIONS / f"test_{name}.py"
    if path.exists():
        return None
    summary = f"[{err.kind}] {err.message.strip().splitlines()[0][:160] if err.message.strip() else ''}"
    literal = f"r'''{source}'''" if "'''" not in source and not source.endswith("\\") else repr(source)
    crash = err.kind in ("crash", "timeout")  # run it in a worker, or the abort ends pytest
    path.write_text(TEMPLATE.format(
        name=name, summary=summary, found_by=found_by, source=literal, program=textwrap.indent(repr(prog), "    "),
        program_json=repr(prog.to_json()),
        worker_import="from tests.fuzz.worker import shared\n" if crash else "",
        runner=", runner=shared()" if crash else ""))
    return path


class Session:
    """Counts of one run: examples, no-verdict, known bugs by name, new failures, sizes."""

    def __init__(self, shrink_s: float, deadline: float) -> None:
        self.examples = self.no_verdict = 0
        self.deadline = deadline  # time.monotonic() at which no new example starts
        self.known: Counter = Counter()
        self.new: list[tuple[Program, FuzzFailure, Path | None]] = []
        self.stats = Stats()
        self.shrink_s = shrink_s

    def run_seed(self, seed_value: int, examples: int, profile: str) -> None:
        state: dict = {"smallest": None, "since": None}

        def size_of(prog: Program) -> tuple[int, int]:
            return len(prog.steps), len(repr(prog))

        @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
                  suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                  phases=[Phase.generate, Phase.shrink])  # explain traces every line: hours
        @seed(seed_value)
        @given(programs(profile))
        def prop(prog: Program) -> None:
            now = time.monotonic()
            if state["since"] is None and now > self.deadline:
                return  # the run's time is up
            if state["since"] is not None and now - state["since"] > self.shrink_s:
                return  # shrink budget spent: let hypothesis finish; the smallest failure is kept
            try:
                check_program(prog, shared())
            except ReferenceFailed:
                self.no_verdict += 1
                return
            except FuzzFailure as err:
                bug = known_bug(prog, err)
                if bug is not None:
                    if state["since"] is None:
                        self.known[bug.name] += 1
                        print(f"seed {seed_value}: known {bug.name} {str(err).splitlines()[0][:200]}", flush=True)
                    return
                if state["smallest"] is None or size_of(prog) < size_of(state["smallest"][0]):
                    state["smallest"] = (prog, err)
                state["since"] = state["since"] or time.monotonic()
                raise
            finally:
                if state["since"] is None:
                    self.examples += 1
                    self.stats.add(prog)

        try:
            prop()
        except Exception:  # noqa: BLE001 - hypothesis re-raises the shrunk failure (or Flaky)
            pass
        if state["smallest"] is not None:
            prog, err = state["smallest"]
            path = write_regression(prog, err, f"``python -m scripts.fuzz --seed {seed_value} --profile {profile}``")
            self.new.append((prog, err, path))
            print(f"seed {seed_value}: NEW FAILURE {err} -> {path or 'already written'}\n{prog!r}", flush=True)

    def report(self, first: int, last: int, minutes: float) -> str:
        lines = [(f"fuzz: seeds {first}..{last}, {self.examples} examples ({self.no_verdict} without verdict: "
                  f"TVM's build fails too), {sum(self.known.values())} known-bug failures, {len(self.new)} new, "
                  f"{minutes:.1f} minutes")]
        lines += [f"  known {name}: {n}" for name, n in self.known.most_common()]
        lines += [f"  new [{err.kind}] {err.message.splitlines()[0][:150]} -> {path}" for _, err, path in self.new]
        return "\n".join(lines + [self.stats.report()])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0, help="first seed; later ones count up")
    ap.add_argument("--profile", choices=sorted(PROFILES) + ["ci"], default="all")
    ap.add_argument("--examples-per-seed", type=int, default=20)
    ap.add_argument("--shrink-minutes", type=float, default=3.0)
    ap.add_argument("--stats", action="store_true", help="print what the profile draws; run nothing")
    ap.add_argument("--count", type=int, default=200, help="programs to list with --stats")
    args = ap.parse_args(argv)
    if args.stats:
        if args.profile == "ci":
            progs = [draw_program(*c) for c in CI_CASES]
        else:
            cases = PROFILES[args.profile]
            progs = [draw_program(*cases[k % len(cases)], args.seed + k) for k in range(args.count)]
        print(stats_of(progs).report())
        return 0
    if args.profile == "ci":
        ap.error("the ci profile runs in the test suite: pytest tests/fuzz")
    shared().start()  # the workers import TVM while the first programs are drawn
    start = time.monotonic()
    session = Session(args.shrink_minutes * 60, start + args.minutes * 60)
    s = args.seed
    while time.monotonic() < session.deadline:
        session.run_seed(s, args.examples_per_seed, args.profile)
        print(f"seed {s}: {session.examples} examples so far, known {sum(session.known.values())}, "
              f"new {len(session.new)} ({(time.monotonic() - start) / 60:.1f} min)", flush=True)
        s += 1
    print(session.report(args.seed, s - 1, (time.monotonic() - start) / 60), flush=True)
    return 1 if session.new else 0


if __name__ == "__main__":
    sys.exit(main())
