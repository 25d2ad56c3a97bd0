"""Differential fuzzing: random Relax programs compiled by us vs TVM's default build and numpy.

The CI profile: a fixed list of (family, size, seed) cases (``strategies.CI_CASES``),
each the same program on every run, compiled in a worker process so that an abort is a
failure of that case. A failure that matches ``known_bugs.KNOWN_BUGS`` is skipped with
the bug's name. ``python -m scripts.fuzz --minutes N --profile realistic`` runs the
families for longer under hypothesis (shrinking each new failure into
``tests/regressions/``); ``python -m scripts.fuzz --stats`` prints the sizes and ops this
profile reaches. Both use the engine of this package (``check.check_program``).
"""

from __future__ import annotations

import pytest

from .check import FuzzFailure, ReferenceFailed, check_program
from .known_bugs import known_bug
from .strategies import CI_CASES, case_id, draw_program
from .worker import shared

shared().start()  # the workers import TVM while pytest collects and runs the tests before these


@pytest.mark.parametrize(("family", "realistic", "seed"), CI_CASES, ids=[case_id(*c) for c in CI_CASES])
def test_compiled_matches_reference(family: str, realistic: bool, seed: int) -> None:
    prog = draw_program(family, realistic, seed)
    try:
        check_program(prog, shared())
    except ReferenceFailed as err:
        pytest.skip(f"TVM's default build fails too, no verdict: {err}")
    except FuzzFailure as err:
        bug = known_bug(prog, err)
        if bug is None:
            raise FuzzFailure(err.kind, f"{err.message}\nprogram:\n{prog!r}") from err
        pytest.skip(f"known bug {bug.name}: {bug.what} [{err.kind}]")
