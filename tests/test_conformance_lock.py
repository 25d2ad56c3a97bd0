"""The ONNX conformance cases we pass stay passed (``scripts/conformance.py --write-lock``).

``tests/data/conformance_pass.json`` lists every case of the onnx wheel's test data that
``aicf_tvm`` passed when it was written. Each operator case (``simple``, ``pytorch-*``)
must still pass, run through ``aicf_tvm.compile`` only (TVM's own pipeline is the script's
business). The ``light`` architectures are left to the script: each takes minutes.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "tests" / "data" / "conformance_pass.json"


def _conformance():
    spec = importlib.util.spec_from_file_location("aicf_conformance", ROOT / "scripts" / "conformance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


conformance = _conformance()
LOCKED = [c for c in json.loads(LOCK.read_text()) if not c.startswith("light/")]


def test_lock_lists_existing_cases():
    assert LOCKED, "the lock is empty: run scripts/conformance.py --write-lock"
    assert set(LOCKED) <= set(conformance.list_cases()), "a locked case is not in this onnx wheel"


@pytest.mark.parametrize("case", LOCKED)
def test_locked_case_still_passes(case):
    result = conformance.run_case(case, pipelines=("ours",))
    assert result["ours"] == "pass", result
