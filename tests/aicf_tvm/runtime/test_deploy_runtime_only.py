"""A library exported here runs where TVM has only its runtime (the target host).

The target host is a directory holding TVM's Python package with ``libtvm_runtime*``
but no ``libtvm_compiler.so``, ``tvm_ffi``, numpy, typing_extensions and ``aicf_tvm``
(no ``relax_passes``, no ``schedules``), run by ``python -S`` (no site-packages) with
``TVM_USE_RUNTIME_LIB=1``. Its outputs are compared with a float64 numpy implementation
of the encoder layer computed here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import aicf_tvm
from aicf_tvm import DeployError
from aicf_tvm.driver.bundle import write_runtime_site
from aicf_tvm.driver.cli import main
from aicf_tvm.driver.models import SMALL_SIZES, encoder_layer
from aicf_tvm.runtime import cpu_features, deploy
from aicf_tvm.runtime.threads import available_cpus
from tests.aicf_tvm.driver.test_models import numpy_encoder

PROBE = r"""
import json, sys
import numpy as np
import aicf_tvm, tvm
from aicf_tvm import InputError

lib, x_path, out_path = sys.argv[1:4]
model = aicf_tvm.load(lib)
np.save(out_path, model(np.load(x_path)))
try:
    model(np.load(x_path).astype(np.float64))
    bad_input = None
except InputError as err:
    bad_input = str(err)
compiler_side = sorted(m for m in sys.modules
                       if m.split(".")[0] in ("relax_passes", "schedules")
                       or m.startswith(("tvm.relax", "tvm.s_tir", "tvm.topi", "aicf_tvm.driver.pipeline")))
print(json.dumps({"runtime_only": bool(tvm.base._RUNTIME_ONLY), "libs": sorted(tvm.base._LOADED_LIBS),
                  "compiler_side": compiler_side, "bad_input": bad_input, "repr": repr(model),
                  "threads": tvm.runtime.num_threads()}))
"""


@pytest.fixture(scope="module")
def target_host(tmp_path_factory) -> Path:
    """The site ``aicf bundle`` writes: TVM without its compiler library, tvm_ffi, numpy,
    typing_extensions and aicf_tvm, nothing else."""
    site = tmp_path_factory.mktemp("target_host")
    write_runtime_site(site)
    assert not list(site.rglob("libtvm_compiler*"))
    return site


def run_on_target_host(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TVM_"))}
    env.update(PYTHONPATH=str(site), TVM_USE_RUNTIME_LIB="1", PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-S", *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=site, check=False)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    sizes = SMALL_SIZES["encoder_layer"]
    mod, weights = encoder_layer(**sizes, return_params=True)
    out = tmp_path_factory.mktemp("build_host")
    path = aicf_tvm.compile(mod).export(out / "encoder.so")
    x = np.random.default_rng(1).standard_normal((1, sizes["seq"], sizes["hidden"])).astype(np.float32)
    np.save(out / "x.npy", x)
    return path, out / "x.npy", numpy_encoder(x.astype(np.float64), weights, sizes["heads"])


def test_target_host_sees_no_site_packages(target_host):
    done = run_on_target_host(target_host, "-c", "import onnx")
    assert "No module named 'onnx'" in done.stderr  # no site-packages leak in


def test_library_runs_on_a_runtime_only_host(target_host, exported, tmp_path):
    lib, x, expected = exported
    done = run_on_target_host(target_host, "-c", PROBE, str(lib), str(x), str(tmp_path / "out.npy"))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["runtime_only"] and "tvm_compiler" not in report["libs"]
    assert report["compiler_side"] == []
    assert report["bad_input"] == "input x: dtype float64, expected float32"
    assert report["repr"].endswith(f"from {lib}>")
    assert report["threads"] == min(len(available_cpus()), deploy.read_metadata(lib)["target"]["num-cores"])
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected, rtol=1e-4, atol=1e-4)


def test_aicf_run_on_a_runtime_only_host(target_host, exported, tmp_path):
    lib, x, expected = exported
    done = run_on_target_host(target_host, "-m", "aicf_tvm.driver.cli", "run", str(lib), "--input", f"x={x}",
                              "--output", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("output: float32[1, 16, 64] -> ")
    np.testing.assert_allclose(np.load(tmp_path / "output.npy"), expected, rtol=1e-4, atol=1e-4)


def test_aicf_bundle_runs_the_library_with_nothing_installed(exported, tmp_path):
    """``aicf bundle``: the folder's run.sh runs the library with ``python -S`` (no
    site-packages) and TVM's runtime alone, and matches the float64 reference; a folder
    that holds something is refused and left as it was."""
    lib, x, expected = exported
    folder = tmp_path / "bundle"
    assert main(["bundle", str(lib), str(folder)]) == 0
    assert not list(folder.rglob("libtvm_compiler*")) and list(folder.rglob("libtvm_runtime.so"))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHON": sys.executable}
    done = subprocess.run([str(folder / "run.sh"), "--input", f"x={x}", "--output", str(tmp_path / "out")],
                          env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / "out" / "output.npy"), expected, rtol=1e-4, atol=1e-4)
    before = sorted(p.name for p in folder.iterdir())
    assert main(["bundle", str(lib), str(folder)]) == 1
    assert sorted(p.name for p in folder.iterdir()) == before


def test_cpu_check_without_llvm_uses_the_recorded_features(exported, monkeypatch):
    """Runtime-only, LLVM cannot name the host CPU: the library records the instruction-set
    features its target enables, and is refused where /proc/cpuinfo lacks one."""
    lib = exported[0]
    meta = deploy.read_metadata(lib)
    monkeypatch.setattr(deploy, "_host_target", dict)
    deploy.check_target(meta, "encoder.so")  # this host: every feature present
    if not meta["isa_features"]:
        pytest.skip("the library needs no instruction-set extension")
    lacking = meta["isa_features"][0]
    flags = cpu_features.isa_flags()
    monkeypatch.setattr(cpu_features, "isa_flags", lambda: flags - {cpu_features.LLVM_TO_CPUINFO[lacking]})
    with pytest.raises(DeployError, match=rf"encoder\.so: .* instructions {lacking}\b.* this CPU lacks"):
        deploy.check_target(meta, "encoder.so")


@pytest.mark.parametrize("cpuinfo, expected", [
    ("processor\t: 0\nflags\t\t: fpu sse sse2 ssse3 sse4_1 avx2 hypervisor avx512f avx512_vnni bmi1\n",
     {"sse", "sse2", "ssse3", "sse4_1", "avx2", "avx512f", "avx512_vnni", "bmi1"}),
    ("processor\t: 0\nFeatures\t: fp asimd sve\n", {"fp", "asimd", "sve"}),
    ("processor\t: 0\n", set()),
])
def test_isa_flags_keep_only_instruction_set_extensions(cpuinfo, expected):
    assert cpu_features.isa_flags(cpuinfo) == expected


def test_cuda_host_code_is_generic_and_checked_on_load():
    """A CUDA build's host code targets this triple without its mcpu, so that it runs on any
    CPU of the GPU host; a host part for another architecture is refused before dlopen."""
    from aicf_tvm.runtime.targets import resolve_target

    host = resolve_target("cuda").host.export()
    assert host["kind"] == "llvm" and "mcpu" not in host
    meta = {"target": {"kind": "cuda", "arch": "sm_90", "host": {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}},
            "target_description": "cuda arch=sm_90"}
    with pytest.raises(DeployError, match=r"m\.so: compiled for aarch64 .*, this host is x86_64"):
        deploy.check_target(meta, "m.so")
