"""``tune_model.choose``: a record is chosen by its time in the model, and only when it
wins both the screening turns and fresh confirming ones.  The builds and timings are
scripted here (the real ones are exercised end to end by ``tests/aicf_tvm/driver/tuning/test_conv.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import tvm
from tvm import relax

import aicf_tvm.driver.tuning.in_models as tm

# seconds per turn of each task's candidates (None: the default rule), screening / confirming
SCREEN = {"a": {None: 1.0, "a1": 1.0, "a2": 0.8}, "b": {None: 1.0, "b1": 0.9}, "c": {None: 1.0, "c1": 1.01}}
CONFIRM = {"a": {None: 1.0, "a2": 0.79}, "b": {None: 1.0, "b1": 0.995}, "c": {None: 1.0}}
BUILD_S, CALL_S = 10.0, 0.01  # the scripted clock's seconds per build and per warm call


@pytest.fixture
def scripted(monkeypatch, request):
    stages, builds = [], []
    whole_gain = getattr(request, "param", 1.0)  # the models' calls with the records, over the sum of kernels

    clock = [0.0]  # seconds: a build takes BUILD_S, a warm call CALL_S

    def build(self, records):
        builds.append(dict(records))
        clock[0] += BUILD_S
        return dict(records)  # a variant: the record of each task

    def warm_call(self, variant):
        clock[0] += CALL_S
        return CALL_S

    def time(self, variants, turns):
        table = SCREEN if not stages else CONFIRM
        stages.append([dict(v) for v in variants])
        per_task = [{k: [table[k][r]] * turns for k, r in v.items()} for v in variants]
        per_model = [{"m": [sum(table[k][r] for k, r in v.items()) * (whole_gain if any(v.values()) else 1)] * turns}
                     for v in variants]
        return per_task, per_model

    monkeypatch.setattr(tm._Variants, "build", build)
    monkeypatch.setattr(tm._Variants, "warm_call", warm_call)
    monkeypatch.setattr(tm, "_now", lambda: clock[0])
    monkeypatch.setattr(tm._Variants, "time", time)
    return stages, builds


def test_a_record_must_win_the_screen_and_then_the_confirmation(scripted):
    tasks = [SimpleNamespace(key=k, uses=[("m", f"kernel_{k}")]) for k in SCREEN]
    offered = {k: [r for r in SCREEN[k] if r is not None] for k in SCREEN}
    model = tm.TimedModel("m", tvm.IRModule(), [])
    timing = tm.choose([model], tasks, offered, None, None, {}, None)
    (screen, confirm), builds = scripted
    assert builds == [*screen, *confirm]  # the confirming pair is built afresh, not the screen's default
    assert len(screen) == tm.rounds(offered) == 3  # the default, then each task's first and second
    assert screen[2] == {"a": "a2", "b": None, "c": None}  # a task with fewer candidates runs its default
    default, chosen = {"a": None, "b": None, "c": None}, {"a": "a2", "b": "b1", "c": None}
    assert confirm == [default, chosen] * tm.CONFIRM_BUILDS  # each side built again, more than once
    chosen = {k: c.record for k, c in timing.choices.items()}
    assert chosen == {"a": "a2", "b": None, "c": None}  # b's 10% did not hold, c never won
    assert timing.choices["a"].to_json() == {"default_s": 1.0, "tuned_s": 0.79, "candidates": 2}  # confirmed
    assert timing.choices["c"].to_json() == {"default_s": 1.0, "tuned_s": 1.01, "candidates": 1}  # its screen
    assert timing.screened == 2 and "2 record(s) that won the screen" in timing.summary()
    assert timing.default_s["m"] == 3.0 and timing.chosen_s["m"] == pytest.approx(2.785)


def test_a_deadline_times_the_ranks_that_fit_and_none_raises_out_of_time(scripted):
    """Builds take 10 s and a variant's turns 2 x 15 x 0.01 s: after the default's build and
    a warm call (10.01 s) a deadline at 70 s leaves room for one rank (its build, two
    variants' turns, the four confirming builds and their turns: 51.8 s more), not two;
    one 60 s away for none."""
    tasks = [SimpleNamespace(key=k, uses=[("m", f"kernel_{k}")]) for k in SCREEN]
    offered = {k: [r for r in SCREEN[k] if r is not None] for k in SCREEN}
    model = tm.TimedModel("m", tvm.IRModule(), [])
    timing = tm.choose([model], tasks, offered, None, None, {}, None, deadline=70.0)
    (screen, _confirm), _ = scripted
    assert len(screen) == 2 and screen[1] == {"a": "a1", "b": "b1", "c": "c1"}  # the default and the first rank
    assert timing.ranks == (1, 2) and "each task's 1 fastest record(s) of 2" in timing.summary()
    assert timing.choices["a"].record is None and timing.choices["a"].candidates == 1  # a2 was not timed
    assert timing.choices["b"].record is None  # b1's screen win did not hold in the confirmation
    stages, builds = scripted
    stages.clear(), builds.clear()
    with pytest.raises(tm.OutOfTime, match="would not build and time one record"):
        tm.choose([model], tasks, offered, None, None, {}, None, deadline=tm._now() + 60.0)
    assert len(builds) == 1  # the default's build, which measured the time a build takes


def test_inputs_are_ones_for_ids_and_none_for_symbolic_dims():
    def module(shape, dtype):
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType(shape, dtype))
        with bb.function("main", [x]):
            bb.emit_func_output(x)
        return bb.get()

    ids = tm.model_inputs(module((1, 8), "int64"))
    assert len(ids) == 1 and ids[0].dtype == np.int64 and (ids[0] == 1).all()
    (x,) = tm.model_inputs(module((2, 3), "float32"))
    assert x.shape == (2, 3) and x.dtype == np.float32 and len(np.unique(x)) == 6
    assert tm.model_inputs(module((tvm.tirx.Var("n", "int64"), 3), "float32")) is None


@pytest.mark.parametrize("scripted", [1.1], indirect=True)
def test_records_that_win_their_kernels_but_not_the_model_are_dropped(scripted):
    """Every kernel a wins, but the model's calls with a's record take 2% longer than
    without: every task keeps its default."""
    tasks = [SimpleNamespace(key=k, uses=[("m", f"kernel_{k}")]) for k in SCREEN]
    offered = {k: [r for r in SCREEN[k] if r is not None] for k in SCREEN}
    timing = tm.choose([tm.TimedModel("m", tvm.IRModule(), [])], tasks, offered, None, None, {}, None)
    assert not timing.kept and all(c.record is None for c in timing.choices.values())
    assert timing.chosen_s["m"] == pytest.approx(3.0635) and "keeps its default" in timing.summary()


def test_as_many_variants_as_half_the_free_memory_holds(monkeypatch):
    """Every variant keeps its packed weights: a model of 48 MiB of constants gets
    (free / 2) // (2 * 48 MiB + 64 MiB) variants."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4096), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(np.zeros((4096, 3072), "float32"))  # 48 MiB
            out = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(out)
    model = tm.TimedModel("m", bb.get(), [])
    assert tm.weight_bytes(model.kernels) == 4096 * 3072 * 4
    monkeypatch.setattr(tm, "available_bytes", lambda: 2 << 30)
    assert tm.variants_that_fit([model]) == (1 << 30) // ((96 << 20) + (64 << 20)) == 6
    monkeypatch.setattr(tm, "available_bytes", lambda: 300 << 20)
    assert tm.variants_that_fit([model]) == 0
