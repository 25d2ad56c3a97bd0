"""The oracle's own rules: special values, tolerances, known-bug matching, the worker."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from .check import FuzzFailure, close, compare, ieee_special, tolerance
from .known_bugs import KnownBug, known_bug
from .numpy_eval import eval_numpy
from .program import Builder, index_array, random_inputs
from .relax_build import build_module
from .strategies import CI_CASES, FAMILIES, PROFILES, draw_program
from .worker import Worker

F32 = tolerance({"float32"})
NAN, INF = np.float32(np.nan), np.float32(np.inf)


def arr(*values: float) -> np.ndarray:
    return np.array(values, np.float32)


def test_close_equates_nan_and_separates_signed_zeros_and_infinities() -> None:
    got = close(arr(NAN, -0.0, 0.0, INF, -INF, 1.0), arr(NAN, 0.0, 0.0, INF, INF, NAN), 1e-4, 1e-5)
    assert got.tolist() == [True, False, True, True, False, False]


def test_compare_names_a_signed_zero_difference() -> None:
    with pytest.raises(FuzzFailure) as err:
        compare([arr(-0.0, 1.0)], [arr(0.0, 1.0)], None, F32)
    assert err.value.kind == "signed-zero"


def test_compare_accepts_the_ieee_value_where_the_reference_is_not_ieee() -> None:
    """TVM's build folds ``inf * 0.0`` to 0; ours may keep the IEEE NaN, never another value."""
    ieee = [arr(NAN, -0.0)]
    compare([arr(NAN, -0.0)], [arr(0.0, 0.0)], ieee, F32)
    with pytest.raises(FuzzFailure, match="values"):
        compare([arr(1.0, -0.0)], [arr(0.0, 0.0)], ieee, F32)
    assert not ieee_special(arr(2.0), arr(2.0)).any()  # an ordinary value gets no escape


def test_compare_is_normwise_for_cancelled_sums() -> None:
    """An element near 0 next to elements near 100: a float32 sum is off relative to 100."""
    compare([arr(100.0, 3e-4)], [arr(100.0, 0.0)], None, F32)
    with pytest.raises(FuzzFailure, match="values"):
        compare([arr(100.0, 3e-2)], [arr(100.0, 0.0)], None, F32)


def test_compare_checks_numpy_where_both_are_finite() -> None:
    with pytest.raises(FuzzFailure) as err:
        compare([arr(1.0, 2.0)], [arr(1.0, 2.0)], [arr(1.0, 2.5)], F32)
    assert err.value.kind == "numpy"


def test_compare_widens_the_numpy_margin_only_where_ours_has_the_references_bits() -> None:
    """0.2% off numpy (an ill-conditioned softmax): passes where ours is TVM's build bit for
    bit, not where ours differs from it; 20% off fails even with the same bits."""
    compare([arr(1.0, 1.0672)], [arr(1.0, 1.0672)], [arr(1.0, 1.0691)], F32)
    with pytest.raises(FuzzFailure) as err:
        compare([arr(1.0, 1.0672)], [arr(1.0, 1.06721)], [arr(1.0, 1.0691)], F32)
    assert err.value.kind == "numpy"
    with pytest.raises(FuzzFailure, match="numpy"):
        compare([arr(1.0, 2.0)], [arr(1.0, 2.0)], [arr(1.0, 2.5)], F32)


def test_float16_output_in_another_order_passes_when_as_accurate_as_the_reference() -> None:
    """Two float16 sums in different orders: element by element beyond float16's tolerance,
    norm-wise as close to numpy as the reference, passes; twice the reference's error
    norm, or one element far worse, or an infinity where numpy is finite, fails."""
    rng = np.random.default_rng(0)
    exact = rng.uniform(-1, 1, 4096)
    ref = (exact + rng.normal(0, 0.02, exact.size)).astype(np.float16)
    ours = (exact + rng.normal(0, 0.02, exact.size)).astype(np.float16)
    want = exact.astype(np.float16)
    f16 = tolerance({"float16"})
    compare([ours], [ref], [want], f16, None)
    worse = (exact + rng.normal(0, 0.05, exact.size)).astype(np.float16)
    spike = ours.copy()
    spike[7] = np.float16(exact[7] + 0.5)
    infinite = ours.copy()
    infinite[7] = np.float16(np.inf)
    for bad in (worse, spike, infinite):
        with pytest.raises(FuzzFailure, match="values"):
            compare([bad], [ref], [want], f16, None)
    with pytest.raises(FuzzFailure, match="values"):  # no numpy: the element-wise rule alone
        compare([ours], [ref], None, f16, None)


def test_compare_rejects_shape_and_count() -> None:
    with pytest.raises(FuzzFailure, match="shape"):
        compare([arr(1.0)], [arr(1.0, 2.0)], None, F32)
    with pytest.raises(FuzzFailure, match="count"):
        compare([], [arr(1.0)], None, F32)


def test_known_bug_needs_both_the_construct_and_the_symptom() -> None:
    b = Builder("special")
    x = b.input([4], special=True)
    prog = b.build(b.step("add", x, const={"shape": [], "seed": 0, "fill": "zero", "dtype": "float32"}))
    adds_zero = KnownBug("signed-zero-add", "x + 0.0 eliminated",
                         lambda p: any(s.op == "add" and s.params.get("const", {}).get("fill") == "zero"
                                       for s in p.steps), frozenset({"signed-zero"}))
    table = (adds_zero,)
    lost_sign = FuzzFailure("signed-zero", "ours np.float32(-0.0), expected np.float32(0.0)")
    assert known_bug(prog, lost_sign, table).name == "signed-zero-add"
    assert known_bug(prog, FuzzFailure("values", ""), table) is None  # a wrong value is not this bug
    other = Builder("special")
    y = other.input([4])
    plain = other.build(other.step("relu", y))
    assert known_bug(plain, FuzzFailure("signed-zero", ""), table) is None


def test_scatter_indices_are_distinct_along_the_axis() -> None:
    idx = index_array("along", [3, 4], seed=1, dims=[5], axis=0, negative=True)
    assert ((idx >= -5) & (idx < 5)).all()
    assert all(len(set((idx[:, j] % 5).tolist())) == 3 for j in range(4))


def test_every_family_builds_and_has_a_numpy_meaning() -> None:
    for family in FAMILIES:
        for realistic in (False, True):
            prog = draw_program(family, realistic, 0)
            assert prog.family == family
            eval_numpy(prog, random_inputs(prog))


def test_ci_cases_cover_every_family_and_both_sizes() -> None:
    assert {f for f, _, _ in CI_CASES} == set(FAMILIES)
    assert {r for _, r, _ in CI_CASES} == {False, True}
    assert {f for f, _ in PROFILES["realistic"]} >= {"gemm", "conv", "attention", "rownorm", "elementwise"}


def _relu_module():
    b = Builder("graph")
    return build_module(b.build(b.step("relu", b.input([2]))))


def test_worker_reports_an_abort_as_a_crash_and_recovers() -> None:
    aborts = [sys.executable, "-c",
              "import os, sys; sys.stderr.write('boom\\n'); sys.stdin.buffer.read(1); os.abort()"]
    worker = Worker(command=aborts)
    for _ in range(2):  # the second request starts a new child
        with pytest.raises(FuzzFailure) as err:
            worker.ours(_relu_module(), [np.zeros(2, np.float32)])
        assert err.value.kind == "crash" and "SIGABRT" in err.value.message and "boom" in err.value.message
    worker.discard()


def test_worker_times_out() -> None:
    worker = Worker(timeout_s=1, command=[sys.executable, "-c", "import time; time.sleep(60)"])
    with pytest.raises(FuzzFailure, match="timeout"):
        worker.ours(_relu_module(), [np.zeros(2, np.float32)])
    worker.discard()


def test_program_json_round_trip_keeps_tuples_and_special_values() -> None:
    b = Builder("special")
    x = b.input([4, "n"], special=True)
    c = b.step("add", x, const={"shape": [], "seed": 0, "fill": "value", "dtype": "float32", "value": float("nan")})
    prog = b.build((b.step("relu", c), (c,)))
    back = type(prog).from_json(prog.to_json())
    assert repr(back) == repr(prog) and back.outputs == prog.outputs and back.inputs == prog.inputs
    assert isinstance(back.steps[0].args, tuple) and np.isnan(back.steps[0].params["const"]["value"])


def test_a_regression_file_checks_against_numpy_as_the_fuzz_run_did(tmp_path, monkeypatch) -> None:
    """The file ``scripts.fuzz`` writes for a failure carries the program, so a failure
    found against numpy fails the file too: here the file's oracle gets a numpy meaning
    patched 25% off, and its test must raise."""
    import importlib.util

    from scripts import fuzz

    b = Builder("graph")
    x = b.input([3])
    prog = b.build(b.step("relu", x))
    monkeypatch.setattr(fuzz, "REGRESSIONS", tmp_path)
    path = fuzz.write_regression(prog, FuzzFailure("numpy", "example"), "a test")
    spec = importlib.util.spec_from_file_location("regression", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    test = getattr(module, f"test_{path.stem[len('test_'):]}")
    test()  # ours is right: passes
    monkeypatch.setattr(module, "eval_numpy", lambda p, inputs: [1.25 * eval_numpy(p, inputs)[0] + 1.0])
    with pytest.raises(FuzzFailure, match="numpy"):
        test()
