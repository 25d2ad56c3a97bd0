"""The ONNX conformance cases we pass stay passed (``scripts/conformance.py --write-lock``).

``tests/data/conformance_pass.json`` lists every case of the onnx wheel's test data that
``aicf_tvm`` passed when it was written, and the onnx version it was written with. The
number of locked cases is pinned here, so a lock rewritten with fewer cases fails; each
operator case (``simple``, ``pytorch-*``) must still pass, run through ``aicf_tvm.compile``
only (TVM's own pipeline is the script's business). The ``light`` architectures are left
to the script: each takes minutes.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import onnx
import pytest

ROOT = Path(__file__).resolve().parent.parent
# Raise it when the lock grows; it never goes down without a reason in the commit message.
PINNED_CASES = 130


def _conformance():
    spec = importlib.util.spec_from_file_location("aicf_conformance", ROOT / "scripts" / "conformance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


conformance = _conformance()
LOCK = conformance.read_lock()
LOCKED = [c for c in LOCK["cases"] if not c.startswith("light/")]


def test_lock_keeps_its_pinned_number_of_cases():
    count = len(LOCK["cases"])
    assert count >= PINNED_CASES, (
        f"{conformance.LOCK} lists {count} cases, {PINNED_CASES} are pinned: it lost "
        f"{PINNED_CASES - count} (git diff names them); python -m scripts.conformance --write-lock "
        "keeps locked cases unless --allow-drop")
    assert count == PINNED_CASES, f"the lock grew to {count} cases: raise PINNED_CASES to {count}"
    assert len(set(LOCK["cases"])) == count, "the lock lists a case twice"


def test_lock_was_written_with_the_installed_onnx():
    assert LOCK["onnx"] == onnx.__version__, (
        f"the conformance lock was written with onnx {LOCK['onnx']}, onnx {onnx.__version__} is "
        f"installed: the cases and their data come from the wheel. Install onnx=={LOCK['onnx']}, or "
        "run `python -m scripts.conformance --write-lock` under this version (it refuses to drop "
        "a locked case) and raise PINNED_CASES if it grew")


def test_lock_lists_existing_cases():
    missing = sorted(set(LOCK["cases"]) - set(conformance.list_cases()))
    assert not missing, f"locked cases not in the test data of onnx {onnx.__version__}: {missing}"


@pytest.mark.parametrize("case", LOCKED)
def test_locked_case_still_passes(case):
    result = conformance.run_case(case, pipelines=("ours",))
    assert result["ours"] == "pass", f"locked case {case} now gives ours={result['ours']}: {result}"


def test_rewriting_the_lock_keeps_unrun_cases_and_names_each_drop():
    lock = {"onnx": "1.0", "cases": ["simple/a", "simple/b", "simple/c", "simple/gone"]}
    results = [{"case": "simple/a", "ours": "pass"}, {"case": "simple/d", "ours": "pass"},
               {"case": "simple/b", "ours": "wrong", "ours_reason": "output 0: max |diff| 1"}]
    new, drops = conformance.updated_lock(lock, results, ["simple/a", "simple/b", "simple/c", "simple/d"],
                                          "1.0", full_run=False)
    assert new == {"onnx": "1.0", "cases": ["simple/a", "simple/c", "simple/d"]}  # c was not run: kept
    assert drops == ["simple/b: ours=wrong output 0: max |diff| 1",
                     "simple/gone: not in the test data of onnx 1.0"]
    with pytest.raises(SystemExit, match="written with onnx 1.0, onnx 2.0 is installed"):
        conformance.updated_lock(lock, results, [], "2.0", full_run=False)


def test_write_lock_refuses_to_drop_a_locked_case_without_allow_drop(tmp_path, capsys):
    path = tmp_path / "lock.json"
    path.write_text(conformance.json.dumps({"onnx": onnx.__version__, "cases": LOCKED[:2]}))
    before = path.read_text()
    results = [{"case": LOCKED[0], "ours": "error", "ours_reason": "TVMError: boom"}]
    assert not conformance.write_lock(results, full_run=False, allow_drop=False, path=path)
    assert path.read_text() == before
    assert f"lock: drops {LOCKED[0]}: ours=error TVMError: boom" in capsys.readouterr().err
    assert conformance.write_lock(results, full_run=False, allow_drop=True, path=path)
    assert conformance.read_lock(path) == {"onnx": onnx.__version__, "cases": [LOCKED[1]]}
