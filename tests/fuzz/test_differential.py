"""Differential fuzzing: random Relax graphs compiled by us vs TVM's default build and numpy.

A bounded, derandomized run (the same examples every time, ~2-3 minutes on 2 cores);
``scripts/fuzz.py --minutes N`` runs the same property for longer and writes each
failure as a regression test under ``tests/regressions/``.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings

from .check import ReferenceFailed, check_module
from .program import build_module, eval_numpy, random_inputs
from .strategies import programs

FUZZ_SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, print_blob=True,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def check_program(prog) -> None:
    if os.environ.get("AICF_FUZZ_TRACE"):  # a crash (abort) in TVM leaves the last program here
        Path(os.environ["AICF_FUZZ_TRACE"]).write_bytes(pickle.dumps(prog))
    mod = build_module(prog)
    inputs = random_inputs(prog)
    dtypes = {dt for _, dt in prog.inputs} | {s.params.get("dtype", "") for s in prog.steps}
    try:
        check_module(mod, inputs, dtypes, eval_numpy(prog, inputs))
    except ReferenceFailed:
        assume(False)  # TVM cannot build it either: no verdict


@FUZZ_SETTINGS
@given(programs())
def test_compiled_matches_reference(prog) -> None:
    check_program(prog)
