"""No illegal instruction: a target whose instruction-set features this CPU lacks is
refused before any kernel runs, by ``CompiledModel`` after compile and by ``load``
(runtime-only included, from the features the library records); and a model runs right
when called from many threads at once."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tvm
from tvm import relax

import aicf_tvm
from aicf_tvm import DeployError, TargetError
from aicf_tvm.driver.models import BUILTIN_MODELS
from aicf_tvm.runtime import cpu_features, deploy
from aicf_tvm.runtime.cpu_features import LLVM_TO_CPUINFO, is_x86, target_isa, unrunnable_here
from aicf_tvm.runtime.targets import resolve_target

HOST_FLAGS = cpu_features.isa_flags()
pytestmark = pytest.mark.skipif(not (is_x86({}) and HOST_FLAGS),
                                reason="x86 feature names and /proc/cpuinfo flags only")
# CPUs LLVM knows, oldest first; a test takes the first this host cannot run
OTHER_CPUS = ("znver2", "znver3", "znver4", "skylake-avx512", "icelake-server", "sapphirerapids",
              "graniterapids", "znver5", "diamondrapids")


def reference(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    """TVM's default build (one kernel per op, generic x86-64)."""
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@pytest.fixture(scope="module")
def model_and_input():
    mod = BUILTIN_MODELS["encoder_layer_small"]()
    x = np.random.default_rng(0).standard_normal((1, 16, 64)).astype(np.float32)
    return mod, x


def test_isa_follows_mcpu_and_mattr():
    haswell = set(target_isa({"kind": "llvm", "mcpu": "haswell"}))
    assert {"avx2", "fma", "f16c", "bmi2"} <= haswell and "avx512f" not in haswell
    assert "avx512f" in target_isa({"kind": "llvm", "mcpu": "haswell", "mattr": ["+avx512f"]})
    assert "avx2" not in target_isa({"kind": "llvm", "mcpu": "haswell", "mattr": ["-avx2"]})
    assert set(haswell) <= set(LLVM_TO_CPUINFO)


def test_a_target_this_cpu_lacks_runs_no_kernel(model_and_input, tmp_path):
    """Compiling for a CPU with extensions this one lacks gives a model that can be
    exported for that CPU, but refuses to run here, naming the extensions."""
    mod, x = model_and_input
    other = next((c for c in OTHER_CPUS if unrunnable_here({"kind": "llvm", "mcpu": c})), None)
    if other is None:
        pytest.skip("this CPU has every extension of the CPUs named")
    model = aicf_tvm.compile(mod, target={"kind": "llvm", "mcpu": other})
    lacking = unrunnable_here({"kind": "llvm", "mcpu": other})
    with pytest.raises(TargetError, match=rf"{other}.*whose instructions .*{lacking[0]}"):
        model(x)
    path = model.export(tmp_path / "other.so")
    with pytest.raises(DeployError, match=rf"other\.so: compiled for CPU {other} .*{lacking[0]}"):
        aicf_tvm.load(path)


def test_this_mcpu_with_an_extension_the_cpu_lacks_is_refused(model_and_input, monkeypatch, tmp_path):
    """The same mcpu name with ``mattr`` (or a CPU that hides an extension of its model):
    comparing mcpu names passed it, and its first call died of SIGILL."""
    mod, x = model_and_input
    host = resolve_target("llvm").export()
    isa = target_isa(host)
    assert isa, "the host target enables no extension"
    feature = "avx2" if "avx2" in isa else isa[-1]
    monkeypatch.setattr(cpu_features, "isa_flags", lambda: HOST_FLAGS - {LLVM_TO_CPUINFO[feature]})
    model = aicf_tvm.compile(mod, target={k: v for k, v in host.items() if k != "mattr"})
    with pytest.raises(TargetError, match=rf"instructions .*\b{feature}\b"):
        model(x)
    monkeypatch.undo()
    path = aicf_tvm.compile(mod).export(tmp_path / "host.so")
    monkeypatch.setattr(cpu_features, "isa_flags", lambda: HOST_FLAGS - {LLVM_TO_CPUINFO[feature]})
    with pytest.raises(DeployError, match=rf"host\.so: .* instructions .*\b{feature}\b.* this CPU lacks"):
        aicf_tvm.load(path)


def test_a_library_for_an_older_cpu_loads_and_runs(model_and_input, tmp_path):
    """Features decide, not names: a library for Haswell runs on any later x86 CPU."""
    mod, x = model_and_input
    if unrunnable_here({"kind": "llvm", "mcpu": "haswell"}):
        pytest.skip("this CPU lacks a Haswell extension")
    path = aicf_tvm.compile(mod, target={"kind": "llvm", "mcpu": "haswell"}).export(tmp_path / "h.so")
    assert "avx512f" not in deploy.read_metadata(path)["isa_features"]
    np.testing.assert_allclose(aicf_tvm.load(path)(x), reference(mod, x), rtol=1e-4, atol=1e-4)


def test_the_host_target_leaves_out_extensions_the_cpu_hides(monkeypatch):
    """LLVM names the host CPU by its model; extensions a VM hides become ``-feature``."""
    isa = target_isa(resolve_target("llvm").export())
    hidden = "avx2" if "avx2" in isa else isa[-1]
    monkeypatch.setattr(cpu_features, "isa_flags", lambda: HOST_FLAGS - {LLVM_TO_CPUINFO[hidden]})
    target = resolve_target("llvm").export()
    assert f"-{hidden}" in target.get("mattr", ())
    assert hidden not in target_isa(target) and not unrunnable_here(target)


def test_one_model_called_from_four_threads(model_and_input):
    """4 threads x 60 calls of one model, each thread its own input: every result equal to
    the single-threaded one and to TVM's default build (the VM's frames are per thread)."""
    mod, _ = model_and_input
    model = aicf_tvm.compile(mod)
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((1, 16, 64)).astype(np.float32) for _ in range(4)]
    expected = [model(x) for x in inputs]
    for x, want in zip(inputs, expected):
        np.testing.assert_allclose(want, reference(mod, x), rtol=1e-4, atol=1e-4)
    assert not np.allclose(expected[0], expected[1])  # the inputs matter
    failures: list[str] = []

    def work(k: int) -> None:
        for i in range(60):
            try:
                got = model(inputs[k])
            except Exception as err:  # noqa: BLE001 - every failure is reported below
                failures.append(f"thread {k} call {i}: {type(err).__name__}: {err}")
                continue
            if not np.array_equal(got, expected[k]):
                failures.append(f"thread {k} call {i}: wrong result")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:3]
