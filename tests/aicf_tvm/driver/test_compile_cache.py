"""The compile cache (``aicf_tvm/driver/compile_cache.py``): a second compile of a model
loads the library the first exported; other options, another model or a changed file
miss; a corrupt entry is rebuilt with a warning; the folder keeps to its size limit;
concurrent writers leave a whole library; ``aicf compile`` uses it unless ``--no-cache``;
a model of the same layers takes their schedules from its kernel entries."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import aicf_tvm
from aicf_tvm.core.options import CompileOptions
from aicf_tvm.driver.cli import main
from aicf_tvm.driver.compile_cache import CompileCache

RNG = np.random.default_rng(21)
W = RNG.standard_normal((8, 6)).astype(np.float32)


def _linear_onnx(w: np.ndarray = W) -> onnx.ModelProto:
    """y = relu(x @ w), x [4, 8]."""
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((4, 8)).astype(np.float32)


def _expected(x: np.ndarray, w: np.ndarray = W) -> np.ndarray:
    return np.maximum(x.astype(np.float64) @ w, 0)


def _entries(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("*.so") if not p.name.startswith("."))


def test_a_second_compile_of_a_module_loads_the_first_ones_library(tmp_path):
    mod = aicf_tvm.from_onnx(_linear_onnx())
    first = aicf_tvm.compile(mod, cache_dir=tmp_path)
    [entry] = _entries(tmp_path)
    assert first.optimized is not None and first.exported == entry
    second = aicf_tvm.compile(aicf_tvm.from_onnx(_linear_onnx()), cache_dir=tmp_path)
    assert second.path == str(entry) and list(second.timings) == ["cache"]  # nothing compiled
    for seed in (1, 2):
        x = _x(seed)
        np.testing.assert_array_equal(np.asarray(second(x)), np.asarray(first(x)))
        np.testing.assert_allclose(np.asarray(second(x)), _expected(x), rtol=1e-5, atol=1e-5)
    assert second.report.summary() == first.report.summary()


def test_other_options_another_model_or_no_cache_miss(tmp_path):
    mod = aicf_tvm.from_onnx(_linear_onnx())
    aicf_tvm.compile(mod, cache_dir=tmp_path)
    aicf_tvm.compile(mod, cache_dir=tmp_path, options=CompileOptions(prepack_weights=False))
    other = aicf_tvm.compile(aicf_tvm.from_onnx(_linear_onnx(W + 1)), cache_dir=tmp_path)
    np.testing.assert_allclose(np.asarray(other(_x(3))), _expected(_x(3), W + 1), rtol=1e-5, atol=1e-5)
    assert len(_entries(tmp_path)) == 3
    fresh = aicf_tvm.compile(mod, cache_dir=tmp_path, cache=False)
    assert fresh.path is None and "normalize" in fresh.timings and len(_entries(tmp_path)) == 3


def test_an_onnx_file_hits_without_its_import_and_a_changed_file_misses(tmp_path):
    path, cache = tmp_path / "linear.onnx", tmp_path / "cache"
    onnx.save(_linear_onnx(), path)
    aicf_tvm.compile(path, cache_dir=cache)
    hit = aicf_tvm.compile(str(path), cache_dir=cache)
    assert "import" not in hit.timings and hit.path is not None
    onnx.save(_linear_onnx(W * 2), path)
    changed = aicf_tvm.compile(path, cache_dir=cache)
    assert "import" in changed.timings
    np.testing.assert_allclose(np.asarray(changed(_x(4))), _expected(_x(4), W * 2), rtol=1e-5, atol=1e-5)


def test_a_corrupt_entry_is_rebuilt_with_a_warning(tmp_path):
    mod = aicf_tvm.from_onnx(_linear_onnx())
    aicf_tvm.compile(mod, cache_dir=tmp_path)
    [entry] = _entries(tmp_path)
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    entry.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="unusable"):
        rebuilt = aicf_tvm.compile(mod, cache_dir=tmp_path)
    assert rebuilt.path is None and "normalize" in rebuilt.timings
    np.testing.assert_allclose(np.asarray(rebuilt(_x(5))), _expected(_x(5)), rtol=1e-5, atol=1e-5)
    assert aicf_tvm.compile(mod, cache_dir=tmp_path).path == str(entry)  # whole again


def test_the_folder_keeps_to_its_size_limit_least_recently_used_first(tmp_path):
    models = [aicf_tvm.compile(aicf_tvm.from_onnx(_linear_onnx(W + i))) for i in range(3)]
    cache = CompileCache(tmp_path)
    for i, model in enumerate(models):
        cache.put(f"entry{i}", model)
        os.utime(cache.path(f"entry{i}"), (1000 + i, 1000 + i))
    size = cache.path("entry0").stat().st_size
    assert cache.get("entry0") is not None  # used: now the most recent
    CompileCache(tmp_path, limit=2 * size + size // 2).trim()
    assert [p.stem for p in _entries(tmp_path)] == ["entry0", "entry2"]


def test_an_export_of_a_cached_model_is_a_copy_of_its_library(tmp_path):
    mod = aicf_tvm.from_onnx(_linear_onnx())
    aicf_tvm.compile(mod, cache_dir=tmp_path / "cache")
    hit = aicf_tvm.compile(mod, cache_dir=tmp_path / "cache")
    out = hit.export(tmp_path / "out.so")
    assert out.read_bytes() == Path(hit.path).read_bytes()
    np.testing.assert_allclose(np.asarray(aicf_tvm.load(out)(_x(6))), _expected(_x(6)), rtol=1e-5, atol=1e-5)


def test_a_fresh_compile_runs_the_machine_code_of_the_library_it_cached(tmp_path):
    """The compile that writes the cache entry runs from that library (no second code
    generation by the JIT), with the bits of a build run from memory (``cache=False``),
    and keeps its optimized and lowered modules; an export copies the entry, and once the
    entry is gone an export is refused by name, never written from half a model."""
    import tvm

    mod = aicf_tvm.from_onnx(_linear_onnx())
    fresh = aicf_tvm.compile(mod, cache_dir=tmp_path / "cache")
    in_memory = aicf_tvm.compile(mod, cache=False)
    assert isinstance(fresh.executable, tvm.runtime.Module) and fresh.executable.kind == "relax.VMExecutable"
    assert not isinstance(in_memory.executable, tvm.runtime.Module)  # the JIT's code
    assert "jit" in fresh.timings and fresh.lowered is not None and fresh.optimized is not None
    for seed in (7, 8):
        x = _x(seed)
        np.testing.assert_array_equal(np.asarray(fresh(x)), np.asarray(in_memory(x)))
        np.testing.assert_allclose(np.asarray(fresh(x)), _expected(x), rtol=1e-5, atol=1e-5)
    assert fresh.export(tmp_path / "a.so").read_bytes() == fresh.exported.read_bytes()
    fresh.exported.unlink()
    with pytest.raises(aicf_tvm.DeployError, match="the library this model runs from is gone"):
        fresh.export(tmp_path / "b.so")
    assert not (tmp_path / "b.so").exists()
    in_memory.export(tmp_path / "c.so")  # a model built in memory writes its code
    np.testing.assert_allclose(np.asarray(aicf_tvm.load(tmp_path / "c.so")(_x(9))), _expected(_x(9)),
                               rtol=1e-5, atol=1e-5)


def test_concurrent_compiles_of_one_model_leave_a_whole_entry(tmp_path):
    path, cache = tmp_path / "linear.onnx", tmp_path / "cache"
    onnx.save(_linear_onnx(), path)
    code = f"import aicf_tvm; aicf_tvm.compile({str(path)!r}, cache_dir={str(cache)!r}, warm_up=False)"
    env = {k: v for k, v in os.environ.items() if k != "AICF_CACHE_DIR"}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(2)]
    assert [p.wait(timeout=600) for p in procs] == [0, 0]
    [entry] = _entries(cache)
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temporary left
    np.testing.assert_allclose(np.asarray(aicf_tvm.load(entry)(_x(7))), _expected(_x(7)), rtol=1e-5, atol=1e-5)


def test_the_cli_uses_the_cache_unless_told_not_to(tmp_path, monkeypatch, capsys):
    path, cache = tmp_path / "linear.onnx", tmp_path / "cache"
    onnx.save(_linear_onnx(), path)
    monkeypatch.setenv("AICF_CACHE_DIR", str(cache))
    assert main(["compile", str(path), "-o", str(tmp_path / "a.so"), "--no-cache"]) == 0
    assert not cache.exists()
    assert main(["compile", str(path), "-o", str(tmp_path / "b.so")]) == 0
    [entry] = _entries(cache)
    assert (tmp_path / "b.so").read_bytes() == entry.read_bytes()
    capsys.readouterr()
    assert main(["compile", str(path), "-o", str(tmp_path / "c.so"), "--timings"]) == 0
    table = capsys.readouterr().out
    assert "cache" in table and "normalize" not in table  # loaded, not compiled
    np.testing.assert_allclose(np.asarray(aicf_tvm.load(tmp_path / "c.so")(_x(8))), _expected(_x(8)),
                               rtol=1e-5, atol=1e-5)


def test_targets_this_machine_cannot_run_are_not_cached(tmp_path):
    from aicf_tvm.driver.compile_cache import cacheable
    from aicf_tvm.runtime.targets import resolve_target

    options = CompileOptions()
    assert cacheable(options, resolve_target("llvm"))
    assert not cacheable(options, resolve_target({"kind": "cuda", "arch": "sm_90"}))
    assert not cacheable(options, resolve_target({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}))
    assert not cacheable(CompileOptions(database=str(tmp_path)), resolve_target("llvm"))


def test_a_folder_that_cannot_be_written_compiles_without_caching(tmp_path):
    blocked = tmp_path / "a_file"
    blocked.write_text("not a folder")
    with pytest.warns(UserWarning, match="cannot write"):
        model = aicf_tvm.compile(aicf_tvm.from_onnx(_linear_onnx()), cache_dir=blocked / "cache")
    np.testing.assert_allclose(np.asarray(model(_x(9))), _expected(_x(9)), rtol=1e-5, atol=1e-5)
    assert model.exported is None and blocked.read_text() == "not a folder"


def test_a_size_limit_that_is_not_a_number_is_our_error(tmp_path, monkeypatch):
    from aicf_tvm.core.errors import AicfError

    monkeypatch.setenv("AICF_CACHE_MAX_GB", "lots")
    with pytest.raises(AicfError, match="AICF_CACHE_MAX_GB='lots': not a number"):
        aicf_tvm.compile(aicf_tvm.from_onnx(_linear_onnx()), cache_dir=tmp_path)


def _counting_schedules(monkeypatch) -> list:
    """The kernels the rules schedule (``schedules.schedule_func`` calls), as names."""
    import schedules

    calls, real = [], schedules.schedule_func

    def counted(func, target, rules):
        calls.append(func)
        return real(func, target, rules)

    monkeypatch.setattr(schedules, "schedule_func", counted)
    return calls


def _counting_builds(monkeypatch) -> list:
    """The LLVM modules ``build_in_parts`` generates code for (``tvm.tirx.build`` calls)."""
    import tvm

    calls, real = [], tvm.tirx.build

    def counted(mod, *args, **kwargs):
        calls.append(mod)
        return real(mod, *args, **kwargs)

    monkeypatch.setattr(tvm.tirx, "build", counted)
    return calls


def test_a_model_with_the_same_layers_takes_their_kernels_from_the_kernel_cache(tmp_path, monkeypatch):
    """Another model of the same layer shapes (other weights: another library) schedules
    no kernel and generates no code; its kernels are the ones the rules make (the bits of
    a build without the cache, run in-process and exported) and it computes its own
    weights' results."""
    calls, builds = _counting_schedules(monkeypatch), _counting_builds(monkeypatch)
    aicf_tvm.compile(aicf_tvm.from_onnx(_linear_onnx()), cache_dir=tmp_path, warm_up=False)
    kernels, code = sorted(tmp_path.glob("*.kernel")), sorted(tmp_path.glob("*.ll"))
    assert kernels and len(calls) == len(kernels) and code and len(builds) == len(code)
    calls.clear()
    builds.clear()
    other_w = W * -0.5 + 0.25
    other = aicf_tvm.compile(aicf_tvm.from_onnx(_linear_onnx(other_w)), cache_dir=tmp_path)
    assert calls == [] and builds == [] and len(_entries(tmp_path)) == 2
    assert sorted(tmp_path.glob("*.kernel")) == kernels and sorted(tmp_path.glob("*.ll")) == code
    plain = aicf_tvm.compile(aicf_tvm.from_onnx(_linear_onnx(other_w)), cache=False)
    assert len(calls) == len(kernels)  # without the cache: scheduled
    exported = aicf_tvm.load(other.export(tmp_path / "other.so"))
    for seed in (10, 11):
        x = _x(seed)
        np.testing.assert_array_equal(np.asarray(other(x)), np.asarray(plain(x)))
        np.testing.assert_array_equal(np.asarray(exported(x)), np.asarray(plain(x)))
        np.testing.assert_allclose(np.asarray(other(x)), _expected(x, other_w), rtol=1e-5, atol=1e-5)
    calls.clear()
    aicf_tvm.compile(aicf_tvm.from_onnx(_linear_onnx(W + 2)), cache_dir=tmp_path,
                     options=CompileOptions(numerics="relaxed"))
    assert len(calls) == len(kernels)  # other options: other entries


@pytest.mark.parametrize("kind", ["kernel", "ll"])
@pytest.mark.parametrize("damage", ["flipped byte", "cut", "not json"])
def test_a_damaged_kernel_entry_is_made_again_with_a_warning(tmp_path, monkeypatch, damage, kind):
    """A kernel's schedule or code entry flipped, cut, or whole (its digest right) but of
    nothing the reader takes: warned, that kernel alone scheduled or built again."""
    aicf_tvm.compile(aicf_tvm.from_onnx(_linear_onnx()), cache_dir=tmp_path, warm_up=False)
    entry = max(tmp_path.glob(f"*.{kind}"), key=lambda p: p.stat().st_size)  # the matmul's
    data = entry.read_bytes()
    if damage == "flipped byte":
        data = data[:-40] + bytes([data[-40] ^ 0x04]) + data[-39:]
    elif damage == "cut":
        data = data[: len(data) // 2]
    else:
        head = data.split(b"\n")[0].rsplit(b" ", 1)[0]
        data = head + b" " + hashlib.sha256(b"{").hexdigest().encode() + b"\n{"
    entry.write_bytes(data)
    calls = _counting_schedules(monkeypatch) if kind == "kernel" else _counting_builds(monkeypatch)
    then = "scheduling again" if kind == "kernel" else "building again"
    with pytest.warns(UserWarning, match=f"unusable .*{then}"):
        model = aicf_tvm.compile(aicf_tvm.from_onnx(_linear_onnx(W * 3)), cache_dir=tmp_path)
    assert len(calls) == 1 and entry.read_bytes() != data  # that kernel alone, written again
    np.testing.assert_allclose(np.asarray(model(_x(12))), _expected(_x(12), W * 3), rtol=1e-5, atol=1e-5)
