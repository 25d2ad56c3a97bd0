"""End to end: ``aicf_tvm.tune`` writes records that ``compile(database=...)`` applies.

Kept tiny (one 64x512x96 GEMM, at most 6 measured candidates, a raised builder timeout)
because it really runs MetaSchedule: about two minutes on 2 busy cores.  K has several
blocks, so the default schedule prefetches B panels (the knobs' tests switch that off).  The GEMM is
searched in our rule's design spaces (``schedules.tuning.space``).
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import tvm

import aicf_tvm
from aicf_tvm.core.errors import TuningError
from aicf_tvm.core.options import CompileOptions
from aicf_tvm.driver.tuning import in_models
from schedules.cpu.gemm_blocks import PREPACK_ANNOTATION
from schedules.select import open_database, record_digest
from tests.schedules.tuning.test_tasks import gemm_model

# one worker for the tuning tests that time kernels against each other (pyproject.toml)
pytestmark = pytest.mark.xdist_group("tuning")

TRIALS = 4


def reference(x: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((512, 96)).astype("float32")
    b = rng.standard_normal((96,)).astype("float32")
    return np.maximum(x @ w + b, 0)


@pytest.fixture(scope="module")
def model():
    return gemm_model([(512, 96)])


@pytest.fixture(scope="module")
def tuned(model, tmp_path_factory):
    """A tuned work dir, its records timed in the model whatever their kernel times (a
    search of 4 trials may find none within ``in_models.PLAUSIBLE`` of the default)."""
    work_dir = tmp_path_factory.mktemp("tuning")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(in_models, "PLAUSIBLE", float("inf"))
        result = aicf_tvm.tune(model, trials=TRIALS, trials_per_task=TRIALS, work_dir=work_dir,
                               builder_timeout=300, progress=False)
    return work_dir, result


def copy_of(work_dir, tmp_path):
    return shutil.copytree(work_dir, tmp_path / "copy")


def test_writes_records_and_measures_the_default(tuned):
    work_dir, result = tuned
    (task,) = result.tasks
    assert task.kind == "fused_gemm_bias_act" and task.trials == TRIALS
    assert task.default_s is not None and task.tuned_s is not None
    lines = (work_dir / "database_tuning_record.json").read_text().splitlines()
    assert len(lines) == TRIALS + 2  # the searched candidates, the default and its plan's trace
    assert all(len(json.loads(line)[1][1]) == 1 for line in lines)  # each its fastest repeat
    summary = json.loads((work_dir / "aicf_tuning.json").read_text())["tasks"]
    assert summary[task.key]["choice"] == task.choice
    assert (summary[task.key]["record"] is None) == (task.choice == "default")


def test_search_stays_in_our_rules_space(tuned):
    """Every searched candidate is our GEMM rule's schedule (its reindex and packing, its
    sampled block sizes), not MetaSchedule's multi-level tiling (which samples unrolling)."""
    work_dir, _ = tuned
    rows = [json.loads(line) for line in (work_dir / "database_tuning_record.json").read_text().splitlines()]
    kinds = [[inst[0] for inst in row[1][0][0]] for row in rows]
    searched = [k for k in kinds if "SamplePerfectTile" in k]
    assert len(searched) == TRIALS + 1  # all but the default rule's untuned schedule
    for k in searched:
        assert {"ReIndex", "TransformLayout"} <= set(k) and "SampleCategorical" not in k


def _slowed(workload, target):
    """Our default plan's kernel with K blocked by 1: C goes through memory once per k, a
    much slower kernel than the default."""
    from schedules.tuning.space import design_spaces

    trace = design_spaces(workload, target)[0].trace
    k_tile = [i for i in trace.insts if i.kind.name == "SamplePerfectTile"][-1]
    k = int(workload["main"].params[0].ty.shape[-1])
    sch = tvm.s_tir.Schedule(workload)
    trace.with_decision(k_tile, [k, 1], remove_postproc=True).apply_to_schedule(sch, remove_postproc=True)
    return sch


def test_a_lucky_measurement_is_not_chosen(model, tuned, tmp_path):
    """A record stored with a lucky time (1 ns) for a kernel slower than the default: the
    outcome measures it again side by side with the default, and it is not the choice."""
    from tvm.s_tir import meta_schedule as ms

    from aicf_tvm.driver.tuning.run import lower_for_tuning
    from aicf_tvm.runtime.targets import resolve_target
    from schedules.select import open_database, record_digest
    from schedules.tuning.tasks import extract_tasks

    work_dir, _ = tuned
    copy = copy_of(work_dir, tmp_path)
    (copy / "aicf_tuning.json").unlink()  # no saved outcome: the next run judges again
    target = resolve_target("llvm")
    (task,) = extract_tasks([("m", lower_for_tuning(model, target))], target)
    slow = _slowed(task.workload, target)
    db = open_database(copy, create=True)
    args = ms.arg_info.ArgInfo.from_entry_func(slow.mod, remove_preproc=True)
    db.commit_tuning_record(ms.database.TuningRecord(slow.trace, db.commit_workload(task.workload), [1e-9],
                                                     target, args))
    del db
    again = aicf_tvm.tune(model, trials=TRIALS + 1, trials_per_task=TRIALS + 1, work_dir=copy, progress=False)
    (outcome,) = again.tasks
    assert again.measured == 0 and outcome.skipped
    assert outcome.record != record_digest(slow.trace) and outcome.tuned_s > 1e-6
    summary = json.loads((copy / "aicf_tuning.json").read_text())["tasks"][outcome.key]
    assert summary["record"] == outcome.record


def test_compile_keeps_the_faster_of_default_and_tuned(model, tuned):
    work_dir, result = tuned
    (kernel,) = aicf_tvm.compile(model, database=work_dir).kernels
    assert kernel.schedule == ("tuned" if result.tasks[0].choice == "tuned" else "Gemm")


def test_compile_applies_a_winning_record(model, tuned, tmp_path):
    """Mark the record as the winner (as a faster measurement would): compile uses it."""
    work_dir, _ = tuned
    copy = copy_of(work_dir, tmp_path)
    summary = json.loads((copy / "aicf_tuning.json").read_text())
    for entry in summary["tasks"].values():
        entry["choice"] = "tuned"
    (copy / "aicf_tuning.json").write_text(json.dumps(summary))
    compiled = aicf_tvm.compile(model, database=copy)
    assert [k.schedule for k in compiled.kernels] == ["tuned"]
    # tuned as it runs: a record that packs the weight (not every plan in the space does)
    # has its packing split out and done at compile time
    (entry,) = summary["tasks"].values()
    records = sorted(open_database(copy).get_all_tuning_records(), key=lambda r: min(float(t) for t in r.run_secs))
    trace = next((r.trace for r in records if record_digest(r.trace) == entry["record"]), records[0].trace)
    packs = PREPACK_ANNOTATION in str(trace)  # named record, else the fastest (as compile picks)
    assert [k.name for k in compiled.kernels] == ["fused_gemm_bias_act" + ("_prepacked" if packs else "")]
    x = np.random.default_rng(1).standard_normal((64, 512)).astype("float32")
    np.testing.assert_allclose(compiled(x), reference(x), rtol=1e-4, atol=1e-4)


def test_a_searched_record_replays_correctly(model, tuned):
    """The best schedule MetaSchedule found (not the default's), applied alone, is right."""
    from tvm.s_tir import meta_schedule as ms

    from aicf_tvm.driver.tuning.run import lower_for_tuning
    from aicf_tvm.runtime.targets import resolve_target
    from schedules.select import open_database
    from schedules.tuning.measure import Baseline, tuned_records
    from schedules.tuning.tasks import default_schedule, extract_tasks

    work_dir, _ = tuned
    target = resolve_target("llvm")
    (task,) = extract_tasks([("m", lower_for_tuning(model, target))], target)
    baseline = Baseline(str(default_schedule(task.workload, target).trace), None)
    best = tuned_records(open_database(work_dir), task, baseline)[0]
    only = ms.database.MemoryDatabase()
    only.commit_tuning_record(ms.database.TuningRecord(
        best.trace, only.commit_workload(task.workload), best.run_secs, target, best.args_info))
    compiled = aicf_tvm.compile(model, database=only)
    assert [k.schedule for k in compiled.kernels] == ["tuned"]
    x = np.random.default_rng(2).standard_normal((64, 512)).astype("float32")
    np.testing.assert_allclose(compiled(x), reference(x), rtol=1e-4, atol=1e-4)


def test_resume_skips_finished_tasks(model, tuned, tmp_path):
    work_dir, _ = tuned
    copy = copy_of(work_dir, tmp_path)
    before = (copy / "database_tuning_record.json").read_bytes()
    again = aicf_tvm.tune(model, trials=TRIALS, trials_per_task=TRIALS, work_dir=copy, progress=False)
    assert again.measured == 0 and again.tasks[0].skipped
    assert (copy / "database_tuning_record.json").read_bytes() == before


def test_resume_continues_an_unfinished_task(model, tuned, tmp_path):
    """A run stopped after 4 of 6 trials measures only the missing ones and keeps the rest."""
    work_dir, _ = tuned
    copy = copy_of(work_dir, tmp_path)
    before = (copy / "database_tuning_record.json").read_text()
    again = aicf_tvm.tune(model, trials=TRIALS + 2, trials_per_task=TRIALS + 2, work_dir=copy,
                          builder_timeout=300, progress=False)
    after = (copy / "database_tuning_record.json").read_text()
    assert 0 < again.measured <= 2 and after.startswith(before)


def test_corrupt_database_raises_and_is_not_overwritten(model, tuned, tmp_path):
    work_dir, _ = tuned
    copy = copy_of(work_dir, tmp_path)
    path = copy / "database_tuning_record.json"
    path.write_text(path.read_text() + '[0, [["GetSBlock"\n')  # a row cut short
    before = path.read_bytes()
    with pytest.raises(TuningError, match="corrupt at line"):
        aicf_tvm.tune(model, trials=TRIALS, work_dir=copy, progress=False)
    with pytest.raises(TuningError, match="corrupt at line"):
        aicf_tvm.compile(model, database=copy)
    assert path.read_bytes() == before


def test_a_spent_time_budget_starts_no_task_and_says_so(model, tmp_path):
    """With the budget spent before the first task nothing is measured (not even the
    default), the task is listed as left, and no model is timed."""
    result = aicf_tvm.tune(model, trials=TRIALS, work_dir=tmp_path / "t", progress=False, time_budget=1e-9)
    assert result.measured == 0 and result.tasks == [] and len(result.over_budget) == 1
    assert result.in_model is None
    assert "not tuned: the search's 6.66667e-10 s of the time budget (1e-09 s) was spent" in str(result)
    with pytest.raises(TuningError, match="time_budget"):
        aicf_tvm.tune(model, trials=TRIALS, work_dir=tmp_path / "u", progress=False, time_budget=0)


def test_only_records_near_the_default_are_timed_in_the_model():
    """A record is offered to the model timing only within ``PLAUSIBLE`` of the default's
    kernel time; a default never measured admits any record."""
    baseline = in_models.sm.Baseline(trace="t", secs=1e-3)
    near, far = (SimpleNamespace(run_secs=[s]) for s in (1.05e-3, 1.2e-3))
    assert in_models.plausible(near, baseline) and not in_models.plausible(far, baseline)
    assert in_models.plausible(far, in_models.sm.Baseline(trace=None, secs=None))


def test_the_summary_says_by_how_much(tuned):
    """Each task's line ends in the ratio behind its verdict: timed in the model, the
    model's (the fixture's task was)."""
    _, result = tuned
    (task,) = result.tasks
    line = next(line for line in str(result).splitlines() if line.strip().startswith(task.key))
    ratio = task.in_model["tuned_s"] / task.in_model["default_s"]
    assert (f"({ratio:.2f}x the default's time in the model)" in line if task.choice == "tuned"
            else f"(best record {ratio:.2f}x the default's time in the model)" in line)


def test_no_candidate_built_raises(model, tmp_path):
    """A builder timeout shorter than any build fails every candidate: say so."""
    with pytest.raises(TuningError, match="built.*builder_timeout"):
        aicf_tvm.tune(model, trials=2, work_dir=tmp_path / "w", builder_timeout=0.001, progress=False)


def test_trials_go_to_tasks_by_cost():
    """Shares follow cost; a task whose share would be under MIN_TRIALS gets none and the
    others get its trials; with no cost known the split is even; never more than given."""
    from aicf_tvm.driver.tuning.run import MIN_TRIALS, trial_shares

    assert trial_shares(40, [3e9, 1e9, 0.0]) == [30, 10, 0]
    shares = trial_shares(48, [7e9, 7e9, 7e9, 2e9, 1e6, 1e5])
    assert shares[4:] == [0, 0] and sum(shares) == 48 and all(s >= MIN_TRIALS for s in shares[:4])
    assert shares[0] > shares[3]
    assert trial_shares(12, [0.0, 0.0, 0.0]) == [4, 4, 4]
    assert trial_shares(4, [4.0, 5.0, 3.0]) == [0, 4, 0]  # too few to share: the costliest
    assert trial_shares(2, [5.0, 4.0, 3.0]) == [2, 0, 0]


def test_a_task_with_fewer_candidates_than_its_share_passes_the_rest_on():
    """A task whose candidates can be counted (a blocked conv's plans) gets at most them;
    the others share what it leaves, by cost, and a task of unknown cost still gets none."""
    from aicf_tvm.driver.tuning.run import trial_shares

    assert trial_shares(40, [3e9, 1e9, 0.0], [11, None, None]) == [11, 29, 0]
    assert trial_shares(40, [3e9, 1e9, 1e9], [5, 3, None]) == [5, 3, 32]
    assert trial_shares(10, [3e9, 1e9], [20, 20]) == [10, 0]  # under MIN_TRIALS: none, as uncapped
    assert sum(trial_shares(100, [3e9, 2e9, 1e9], [11, 11, 11])) == 33


def test_a_model_whose_kernels_are_all_symbolic_and_untunable_says_how_to_tune_it(tmp_path):
    """A kernel with symbolic extents is tuned in its rule's choices (tuning/test_symbolic.py);
    one whose rule has none (an elementwise kernel) keeps its default schedule, and a model
    with only such kernels is refused before anything builds, naming the way to pin the dims."""
    from tvm import relax, tirx

    from aicf_tvm.driver.tuning.run import lower_for_tuning
    from aicf_tvm.runtime.targets import resolve_target
    from schedules.tuning.tasks import symbolic_dims
    from tests.helpers import relax_main

    rows = tirx.Var("rows", "int64")
    x = relax.Var("x", relax.TensorType([rows, 16], "float32"))
    y = relax.Var("y", relax.TensorType([rows, 16], "float32"))
    mod = relax_main([x, y], lambda bb, x, y: relax.op.nn.relu(bb.emit(relax.op.add(x, y))))
    kernels = [f for _, f in lower_for_tuning(mod, resolve_target("llvm")).functions_items()
               if isinstance(f, tirx.PrimFunc)]
    assert kernels and all(symbolic_dims(f) == ["rows"] for f in kernels)
    with pytest.raises(TuningError, match=r"every kernel of model0 has symbolic extents and a default rule "
                                          r"with no tunable choices.*--shape INPUT=D0,D1"):
        aicf_tvm.tune(mod, trials=1, work_dir=tmp_path / "wd", progress=False)
    assert not (tmp_path / "wd").exists()


@pytest.mark.parametrize(("tuned_turns", "default_turns", "choice"), [
    ([0.97, 0.97, 0.97, 0.97, 0.97], [1.0] * 5, "tuned"),
    ([0.99, 0.99, 0.99, 0.99, 0.99], [1.0] * 5, "default"),  # under WIN_MARGIN's 2%: noise
    # its fastest turn beats the default's (0.50 vs 0.60), but turn by turn it loses 3 of 5
    ([0.50, 1.01, 1.01, 1.01, 0.90], [0.60, 1.0, 1.0, 1.0, 1.0], "default"),
    # turn by turn it wins 4 of 5 (median 0.92), but its median turn is 1.2x the default's
    ([0.50, 0.50, 1.20, 1.20, 1.20], [1.0, 1.0, 0.80, 1.30, 1.30], "default"),
])
def test_the_choice_is_the_median_of_paired_turns(monkeypatch, tuned_turns, default_turns, choice):
    """``outcome`` keeps a record only when its time over the default's, turn by turn and
    median to median, is under ``tune_measure.WIN_MARGIN`` (measurements stubbed: the rule
    alone)."""
    import schedules.tuning.measure as tm

    class Record:
        trace = "trace"

    task = type("Task", (), {"key": "k", "kind": "fused_gemm_bias_act", "workload": None})()
    monkeypatch.setattr(tm, "tuned_records", lambda db, task, baseline: [Record()])
    monkeypatch.setattr(tm, "_replayed", lambda trace, workload: "mod")
    monkeypatch.setattr(tm, "timed_form", lambda mod: mod)
    monkeypatch.setattr(tm, "default_schedule",
                        lambda workload, target, options=None: type("S", (), {"mod": "default"})())
    monkeypatch.setattr(tm, "measure", lambda mods, *a, **k: [list(tuned_turns), list(default_turns)])
    monkeypatch.setattr(tm, "record_digest", lambda trace: "digest")
    tools = type("Tools", (), {"builder": None, "runner": None, "options": None})()
    result = tm.outcome(task, None, None, tm.Baseline(trace=None, secs=1.0), tools)
    assert result.choice == choice and (result.record == "digest") == (choice == "tuned")


def test_the_kernel_was_timed_in_the_model_under_either_name(tuned):
    """A record that packs the weight renames the kernel (``..._prepacked``); the model
    timing finds the task's calls under both names."""
    from aicf_tvm.driver.tuning.in_models import _owners

    _, result = tuned
    (task,) = result.tasks
    assert task.in_model is not None and task.in_model["default_s"] > 0
    (model,) = result.models
    fake = SimpleNamespace(key=task.key, uses=[(model, "fused_gemm_bias_act")])
    owners = _owners([SimpleNamespace(name=model)], [fake], {task.key})
    assert owners[model] == {"fused_gemm_bias_act": task.key, "fused_gemm_bias_act_prepacked": task.key}


# --- options: tuning for a compile with other knobs --------------------------------------------

# a knob the test GEMM's schedule reads: its default plan prefetches the next B panel
KNOBS = CompileOptions(gemm_prefetch_b_panels=False)


@pytest.fixture(scope="module")
def tuned_with_knobs(model, tmp_path_factory):
    """A run with ``KNOBS`` (two trials), the options each model variant was scheduled with."""
    work_dir = tmp_path_factory.mktemp("tuning_knobs")
    seen = []
    schedule = in_models.schedule

    def spy(*args, **kwargs):
        seen.append(kwargs.get("options"))
        return schedule(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(in_models, "schedule", spy)
        patch.setattr(in_models, "PLAUSIBLE", float("inf"))  # the model variants are what is checked
        result = aicf_tvm.tune(model, trials=2, trials_per_task=2, work_dir=work_dir, builder_timeout=300,
                               progress=False, options=KNOBS)
    return work_dir, result, seen


def _compile_workload(model, options):
    """The workload of the one kernel ``compile`` builds for ``model`` under ``options``."""
    from aicf_tvm.driver.pipeline import run_pipeline
    from aicf_tvm.runtime.targets import resolve_target
    from schedules.prepack_weights import mark_layout_free
    from schedules.select import workload_of

    target = resolve_target("llvm")
    kernels = mark_layout_free(run_pipeline(model, target, until="kernels", options=options).kernels)
    (workload,) = [w for _, f in kernels.functions_items() if isinstance(f, tvm.tirx.PrimFunc)
                   if (w := workload_of(f, target, options)) is not None]
    return workload


def test_tune_with_options_tunes_the_kernels_compile_builds_with_them(model, tuned_with_knobs):
    """The task is the kernel ``compile(options=KNOBS)`` builds, keyed apart from the default
    knobs' one; its default schedule, design spaces and model variants follow the knobs."""
    from aicf_tvm.runtime.targets import resolve_target
    from schedules.select import SIGNATURE_ATTR
    from schedules.tuning.tasks import default_schedule, valid_records

    work_dir, result, seen = tuned_with_knobs
    (task,) = result.tasks
    workload = _compile_workload(model, KNOBS)  # the records were measured on it
    assert task.key == str(workload["main"].attrs[SIGNATURE_ATTR])
    assert task.key != str(_compile_workload(model, None)["main"].attrs[SIGNATURE_ATTR])
    target = resolve_target("llvm")
    traces = [str(r.trace) for r in valid_records(open_database(work_dir), workload)]
    assert str(default_schedule(workload, target, KNOBS).trace) in traces  # the seed: KNOBS' default
    assert "aicf.gemm_kblock" in str(default_schedule(workload, target).trace)
    assert traces and not any("aicf.gemm_kblock" in t for t in traces)  # no record prefetches B
    summary = json.loads((work_dir / "aicf_tuning.json").read_text())["tasks"]
    assert summary[task.key]["options"] == {"gemm_prefetch_b_panels": False}
    assert seen and all(o is not None and not o.gemm_prefetch_b_panels for o in seen)  # in the models


def test_records_apply_only_to_a_compile_with_the_knobs_they_were_tuned_with(model, tuned, tuned_with_knobs,
                                                                            tmp_path):
    """Every record marked the winner: ``compile(options=KNOBS)`` uses the ``KNOBS`` run's,
    a compile with the default knobs or others does not, nor does ``KNOBS`` the default run's."""
    work_dir, _, _ = tuned_with_knobs
    copy = shutil.copytree(work_dir, tmp_path / "knobs")
    default_copy = shutil.copytree(tuned[0], tmp_path / "default")
    for wd in (copy, default_copy):
        summary = json.loads((wd / "aicf_tuning.json").read_text())
        for entry in summary["tasks"].values():
            entry["choice"] = "tuned"
            entry["record"] = None  # the fastest record (the seeded default's may be the named one)
        (wd / "aicf_tuning.json").write_text(json.dumps(summary))
    compiled = aicf_tvm.compile(model, database=copy, options=KNOBS)
    assert [k.schedule for k in compiled.kernels] == ["tuned"]
    x = np.random.default_rng(3).standard_normal((64, 512)).astype("float32")
    np.testing.assert_allclose(compiled(x), reference(x), rtol=1e-4, atol=1e-4)
    assert [k.schedule for k in aicf_tvm.compile(model, database=copy).kernels] == ["Gemm"]
    other = CompileOptions(gemm_prefetch_b_panels=False, gemm_area_slack=1.2)
    assert [k.schedule for k in aicf_tvm.compile(model, database=copy, options=other).kernels] == ["Gemm"]
    assert [k.schedule for k in aicf_tvm.compile(model, database=default_copy, options=KNOBS).kernels] == ["Gemm"]
    assert [k.schedule for k in aicf_tvm.compile(model, database=default_copy).kernels] == ["tuned"]


def test_tune_keywords_replace_the_options_own(monkeypatch, model, tmp_path):
    """As in ``compile``: ``target`` and ``threads`` given win over the options'; without
    either, the options' (and "llvm")."""
    from aicf_tvm.driver.tuning import run

    seen = []
    monkeypatch.setattr(run, "_tune", lambda specs, tgt, *args, **_: seen.append((tgt, args[-2], args[-1])))
    one, three = (tvm.target.Target({"kind": "llvm", "num-cores": n}) for n in (1, 3))
    run.tune(model, work_dir=tmp_path, options=CompileOptions(target=one, threads=1))
    run.tune(model, three, work_dir=tmp_path, threads=3, options=CompileOptions(target=one, threads=1))
    run.tune(model, work_dir=tmp_path)
    cores = [int(t.export().get("num-cores", 0) or 0) for t, _, _ in seen]
    assert cores[:2] == [1, 3] and seen[2][0].kind.name == "llvm"
    assert [threads for _, threads, _ in seen] == [1, 3, None]
    assert [o.threads for _, _, o in seen] == [1, 3, None] and all(o.target is t for t, _, o in seen)


def test_a_search_past_its_deadline_stops_after_one_batch(model, tmp_path):
    """``time_budget`` is checked inside a task's search too: a search whose deadline has
    passed measures the batch under way (committed to the database) and ends, instead of
    running all its trials."""
    from aicf_tvm.driver.tuning.run import lower_for_tuning
    from aicf_tvm.runtime.targets import resolve_target
    from schedules.tuning import tasks as st
    from schedules.tuning.space import design_spaces

    target = resolve_target("llvm")
    (task,) = st.extract_tasks([("m", lower_for_tuning(model, target))], target)
    db = open_database(tmp_path / "db", create=True)
    tools = st.Tools(target, 60.0, 60.0)
    counted: list[int] = []
    with st.cpu_intrinsics_only(target):
        stopped = st.search(task, target, db, 64, tools, work_dir=str(tmp_path / "ms"), on_batch=counted.append,
                            spaces=design_spaces(task.workload, target), deadline=0.0)
    assert stopped and len(counted) == 1 and 0 < counted[0] < 64
    assert len(db.get_top_k(db.commit_workload(task.workload), 1 << 30)) >= 1
    # a search of one batch: MetaSchedule ends the task itself after it as well (and checks
    # that it was still running); that is the deadline's stop, not a failure
    with st.cpu_intrinsics_only(target):
        assert st.search(task, target, db, 8, tools, work_dir=str(tmp_path / "ms1"), on_batch=counted.append,
                         spaces=design_spaces(task.workload, target), deadline=0.0, seed=1)
