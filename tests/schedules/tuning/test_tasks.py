"""Tuning tasks keyed by contract signature, and the database checks (no tuning run here)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.script import relax as R

from aicf_tvm.core.errors import TuningError
from aicf_tvm.driver.tuning.run import lower_for_tuning
from schedules.select import SIGNATURE_ATTR, open_database, signature_key, workload_of
from schedules.tuning.tasks import extract_tasks


def gemm_model(layers: list[tuple[int, int]], seed: int = 0, rows: int = 64) -> tvm.IRModule:
    """x @ w + b -> relu, once per (in, out) layer; weights are constants from ``seed``."""
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((rows, layers[0][0]), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for n_in, n_out in layers:
                w = relax.const(rng.standard_normal((n_in, n_out)).astype("float32"))
                b = relax.const(rng.standard_normal((n_out,)).astype("float32"))
                y = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.matmul(y, w), b)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def target(cores: int = 2) -> tvm.target.Target:
    return tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": cores})


def emit_funcs(mod: tvm.IRModule) -> list[tvm.tirx.PrimFunc]:
    return [f for _, f in lower_for_tuning(mod, target()).functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and "aicf.emit" in f.attrs]


class TestWorkload:
    def test_same_emit_in_two_models_gives_one_workload(self):
        """Weights are constants outside the kernel: only the signature and the code count."""
        (a,) = emit_funcs(gemm_model([(128, 96)], seed=0))
        b = emit_funcs(gemm_model([(128, 96), (96, 96)], seed=7))[0]
        wa, wb = workload_of(a, target()), workload_of(b, target())
        assert wa["main"].attrs[SIGNATURE_ATTR] == wb["main"].attrs[SIGNATURE_ATTR]
        assert tvm_ffi.structural_equal(wa, wb)
        assert tvm_ffi.structural_hash(wa) == tvm_ffi.structural_hash(wb)

    def test_shape_and_target_change_the_key(self):
        (a,) = emit_funcs(gemm_model([(128, 96)]))
        (other_shape,) = emit_funcs(gemm_model([(128, 96)], rows=32))
        key = workload_of(a, target())["main"].attrs[SIGNATURE_ATTR]
        assert workload_of(other_shape, target())["main"].attrs[SIGNATURE_ATTR] != key
        assert workload_of(a, target(cores=4))["main"].attrs[SIGNATURE_ATTR] != key

    def test_drops_our_attrs_and_keeps_tvm_ones(self):
        (a,) = emit_funcs(gemm_model([(128, 96)]))
        attrs = workload_of(a, target())["main"].attrs
        assert "aicf.emit" not in attrs and "aicf.kind" not in attrs
        assert attrs["tirx.noalias"] and str(attrs["global_symbol"]) == "main"

    def test_a_primfunc_without_an_emit_is_not_a_workload(self):
        func = tvm.tirx.PrimFunc([], tvm.tirx.Evaluate(0))
        assert workload_of(func, target()) is None

    def test_constant_weights_are_in_the_workload_and_its_key(self):
        """Tuning lowers as compile does, weights marked layout-free, so a kernel is timed
        on its prepacked weight; the same kernel fed an activation is another workload."""
        (a,) = emit_funcs(gemm_model([(128, 96)]))
        workload = workload_of(a, target())
        assert [int(i) for i in workload["main"].attrs["layout_free_buffers"]] == [1, 2]  # w, b
        unmarked = workload_of(a.without_attr("layout_free_buffers"), target())
        assert unmarked["main"].attrs[SIGNATURE_ATTR] != workload["main"].attrs[SIGNATURE_ATTR]

    def test_knobs_other_than_the_defaults_change_the_key_and_the_defaults_do_not(self):
        """A record tuned under other ``CompileOptions`` knobs is keyed apart; the default
        options (given, with a target or threads, or not) keep the key records always had."""
        from aicf_tvm.core.options import CompileOptions
        from schedules.select import option_knobs

        (a,) = emit_funcs(gemm_model([(128, 96)]))
        key = workload_of(a, target())["main"].attrs[SIGNATURE_ATTR]
        for same in (CompileOptions(), CompileOptions(target="llvm", threads=1, verify_each_pass=True)):
            assert option_knobs(same) == {}
            assert tvm_ffi.structural_equal(workload_of(a, target(), same), workload_of(a, target()))
        knobs = [CompileOptions(gemm_prefetch_b_panels=False), CompileOptions(gemm_area_slack=1.2),
                 CompileOptions(vector_math=False), CompileOptions(conv_register_tile="partial")]
        keys = {str(workload_of(a, target(), o)["main"].attrs[SIGNATURE_ATTR]) for o in knobs}
        assert len(keys) == len(knobs) and key not in keys
        assert option_knobs(knobs[0]) == {"gemm_prefetch_b_panels": False}

    def test_key_names_the_kind(self):
        assert signature_key({"kind": "fused_gemm_bias_act", "ports": []}).startswith("fused_gemm_bias_act-")


class TestExtractTasks:
    def test_tasks_are_ordered_by_flops_times_calls(self):
        """Each GEMM's FLOPs are at least its 2*M*N*K multiply-adds; a smaller kernel
        called often enough per inference comes first."""
        lowered = lower_for_tuning(gemm_model([(128, 96), (96, 32)]), target())
        names = {int(f.params[1].ty.shape[1]): gv.name_hint for gv, f in lowered.functions_items()
                 if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and "aicf.emit" in f.attrs}
        once = extract_tasks([("m", lowered)], target())
        assert [int(t.workload["main"].params[1].ty.shape[1]) for t in once] == [96, 32]
        assert once[0].flops >= 2 * 64 * 96 * 128 and once[1].flops >= 2 * 64 * 32 * 96
        often = extract_tasks([("m", lowered)], target(), {("m", names[32]): 10})
        assert [int(t.workload["main"].params[1].ty.shape[1]) for t in often] == [32, 96]
        assert often[0].calls == 10 and often[0].cost == 10 * often[0].flops

    def test_one_task_per_signature_across_models(self):
        """The 128->96 GEMM appears in both models: one task, used twice."""
        mods = [("one", lower_for_tuning(gemm_model([(128, 96)]), target())),
                ("two", lower_for_tuning(gemm_model([(128, 96), (96, 96)], seed=3), target()))]
        tasks = extract_tasks(mods, target())
        assert len(tasks) == 2
        shared = [t for t in tasks if len(t.uses) == 2]
        assert len(shared) == 1 and {m for m, _ in shared[0].uses} == {"one", "two"}
        assert tasks[0].flops >= tasks[1].flops  # costliest first


class TestChosenRecord:
    def test_the_named_record_is_applied_not_the_fastest_stored(self):
        """aicf_tuning.json names the record that won when measured again; the database's
        top record (a lucky first measurement) is not the one compile must replay."""
        from tvm.s_tir import meta_schedule as ms

        from schedules.select import _chosen_schedule, record_digest
        from schedules.tuning.space import design_spaces

        (func,) = emit_funcs(gemm_model([(128, 96)]))
        workload = workload_of(func, target())
        first, second = design_spaces(workload, target())[:2]
        db = ms.database.MemoryDatabase()
        token = db.commit_workload(workload)
        args = ms.arg_info.ArgInfo.from_entry_func(first.mod, remove_preproc=True)
        for space, secs in ((first, 1e-9), (second, 1e-3)):
            db.commit_tuning_record(ms.database.TuningRecord(space.trace, token, [secs], target(), args))
        chosen = _chosen_schedule(db, workload, target(), record_digest(second.trace))
        assert tvm_ffi.structural_equal(chosen.mod, second.mod)
        assert not tvm_ffi.structural_equal(chosen.mod, first.mod)
        best = _chosen_schedule(db, workload, target(), None)  # no name: MetaSchedule's best
        assert tvm_ffi.structural_equal(best.mod, first.mod)
        assert _chosen_schedule(db, workload, target(), "0" * 16) is None


class TestOpenDatabase:
    def test_corrupt_record_file_raises_and_is_left_untouched(self, tmp_path):
        path = tmp_path / "database_tuning_record.json"
        path.write_text('[0, [1, 2]\n{not json\n')
        before = path.read_bytes()
        with pytest.raises(TuningError, match=r"corrupt at line 1"):
            open_database(tmp_path)
        assert path.read_bytes() == before

    def test_corrupt_summary_raises(self, tmp_path):
        (tmp_path / "aicf_tuning.json").write_text("[1, 2")
        with pytest.raises(TuningError, match="aicf_tuning.json is corrupt"):
            open_database(tmp_path)

    @pytest.mark.parametrize("entry", [5, {"choice": "maybe"}, {"choice": "tuned", "record": 7}])
    def test_corrupt_summary_entry_raises(self, tmp_path, entry):
        """A task entry compile cannot read (no choice, a record that is not a name) is
        corruption, not a crash inside kernel selection."""
        (tmp_path / "aicf_tuning.json").write_text(json.dumps({"tasks": {"gemm-0123": entry}}))
        with pytest.raises(TuningError, match="'gemm-0123'"):
            open_database(tmp_path)

    def test_missing_dir_raises_unless_created(self, tmp_path):
        with pytest.raises(TuningError, match="does not exist"):
            open_database(tmp_path / "nope")
        open_database(tmp_path / "new", create=True)
        assert (tmp_path / "new").is_dir()


def test_cpu_intrinsics_only_leaves_the_real_package_importable():
    """Inside, MetaSchedule's import is cheap; afterwards the full package loads as usual."""
    code = (
        "import sys, tvm; from schedules.tuning.tasks import cpu_intrinsics_only\n"
        "t = tvm.target.Target({'kind': 'llvm', 'mcpu': 'skylake-avx512'})\n"
        "with cpu_intrinsics_only(t):\n"
        "    import tvm.s_tir.tensor_intrin\n"
        "    assert 'tvm.s_tir.tensor_intrin.cuda' not in sys.modules\n"
        "    assert 'tvm.s_tir.tensor_intrin.x86' in sys.modules\n"
        "assert 'tvm.s_tir.tensor_intrin' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_the_builder_leaves_out_what_the_options_leave_out():
    """Candidates are built as ``compile`` builds under the run's options: an ``exp`` kernel
    calls LLVM's exp under ``vector_math=False`` and is SIMD arithmetic by default."""
    import re

    from aicf_tvm.core.options import CompileOptions
    from schedules.tuning.tasks import _build, build_function, default_schedule
    from tests.helpers import relax_main

    llvm = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    x = relax.Var("x", relax.TensorType([64, 256], "float32"))
    (task,) = extract_tasks([("m", lower_for_tuning(relax_main([x], lambda bb, x: relax.op.exp(x)), llvm))], llvm)
    kernel = default_schedule(task.workload, llvm).mod

    def calls_exp(build):
        return bool(re.search(r"@llvm\.exp", build(kernel, llvm, None).inspect_source("ll")))

    assert build_function(None) is _build and build_function(CompileOptions(gemm_area_slack=1.2)) is _build
    assert not calls_exp(build_function(CompileOptions()))
    assert calls_exp(build_function(CompileOptions(vector_math=False)))
