"""Write a self-contained device-check bundle: models compiled here, run on the target host.

    python -m scripts.gpu_bundle --target cuda|llvm --python X.Y [--with-numpy] --out DIR
    bash DIR/run.sh                  # on the target host: no index, no network, no compiler

Models: the built-in encoder layer (BERT-base) and decoder block, a small residual
convnet, and our fused Adam step over 10M parameters (``scripts/bench_optimizer.py``'s
MLP). Each is compiled with ``aicf_tvm`` for the target (CUDA: sm_90, host code for
generic x86-64) and exported; its weights are not shipped but rebuilt from a seed on both
hosts (``bundle_runner.generate``; the runner checks their sha256). The reference
outputs are computed here by TVM's own LLVM build of the same module (the default
pipeline), which is itself checked against float64 numpy (encoder, decoder, Adam) and
against the PyTorch twins the runner times (when PyTorch is installed here).

The bundle carries TVM's runtime only (``libtvm_runtime``, for CUDA ``libtvm_runtime_cuda``
and the CUDA runtime it links, the ``tvm`` Python modules a runtime-only import loads; not
``libtvm_compiler``), the ``apache-tvm-ffi`` and ``typing_extensions`` wheels for Python
X.Y (``--with-numpy``: numpy's too), ``aicf_tvm`` (its loader), ``runner.py`` and
``run.sh``: at most 60 MiB. ``run.sh`` installs the wheels into ``DIR/site`` with
``pip --no-index --find-links DIR/wheels`` and runs ``runner.py`` with
``TVM_USE_RUNTIME_LIB=1``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax

import aicf_tvm
from aicf_tvm.driver.compiled import compiled_model
from aicf_tvm.driver.models import decoder_block, encoder_layer
from aicf_tvm.runtime.compiled import CompiledModel
from aicf_tvm.runtime.targets import describe, host_cpu_target
from scripts import bundle_runner as runner
from scripts.bundle_models import SEED, Bundled, Streams, adam, arrays_of, convnet, transformer
from scripts.harness import HYPER

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
CUDA = {"kind": "cuda", "arch": "sm_90"}
MAX_BYTES = 60 * 2**20
# TVM's Python subpackages that ``import tvm`` loads with only the runtime library
# (checked by the llvm twin of the bundle); of ``backend`` only its top-level modules.
RUNTIME_PACKAGES = ("driver", "ir", "rpc", "runtime", "script", "support", "sym", "target", "te", "tirx")
TOLERANCE = {"cuda": (2e-3, 2e-3), "llvm": (1e-3, 1e-4)}
ADAM_TOLERANCE = (1e-4, 1e-6)
SAMPLES = 65536  # reference entries shipped per output of the Adam step (10M each otherwise)


def _vm_args(model: Bundled, arrays: list[np.ndarray], dev: Any) -> list[Any]:
    tensors = [tvm.runtime.tensor(a, dev) for a in arrays]
    if model.kind != "optimizer":
        return tensors
    n = model.extra["tensors"]
    return [tuple(tensors[:n]), tuple(tensors[n:2 * n]), tuple(tensors[2 * n:])]


def reference(model: Bundled, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """TVM's default LLVM build of ``model.mod`` on ``arrays`` (P, M, V for the Adam step)."""
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    ex = tvm.compile(model.mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    out = runner._flat(relax.VirtualMachine(ex, tvm.cpu())["main"](*_vm_args(model, arrays, tvm.cpu())))
    if model.kind == "optimizer":
        n = model.extra["tensors"]
        out = out[:n] + out[n + 3:]
    return out


def cross_check(model: Bundled, arrays: list[np.ndarray], ref: list[np.ndarray]) -> list[str]:
    """The reference against float64 numpy and the PyTorch twin (CPU); lines to print."""
    from tests.aicf_tvm.driver.test_models import numpy_decoder, numpy_encoder
    from tests.aicf_tvm.driver.test_optimizer import numpy_adam

    by_name = {s["name"]: a for s, a in zip(model.inputs, arrays)}
    independent = {}
    if model.name in ("encoder_layer", "decoder_block"):
        numpy_ref = numpy_encoder if model.name == "encoder_layer" else numpy_decoder
        independent["numpy"] = [numpy_ref(arrays[0], by_name, model.twin["args"]["heads"])]
    elif model.kind == "optimizer":
        n = model.extra["tensors"]
        steps = [numpy_adam(p, g, np.zeros_like(p), np.zeros_like(p), 1, **HYPER)
                 for p, g in zip(arrays[:n], arrays[n:2 * n])]
        independent["numpy"] = [s[0] for s in steps] + [s[1] for s in steps] + [s[2] for s in steps]
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and model.twin is not None:
        w = {k: torch.from_numpy(v) for k, v in by_name.items()}
        with torch.no_grad():
            twin = runner.TWINS[model.twin["kind"]](torch, w, **model.twin["args"])
            independent["torch"] = [twin(w[model.inputs[0]["name"]]).numpy()]
    elif torch is not None:
        n = model.extra["tensors"]
        step, state = runner.torch_adam_step(
            torch, [torch.from_numpy(a.copy()) for a in arrays[:n]], [torch.from_numpy(a) for a in arrays[n:2 * n]],
            model.extra["hyper"], fused=False)
        step()
        independent["torch"] = runner.adam_results(torch, state)
    rtol, atol = ADAM_TOLERANCE if model.kind == "optimizer" else (1e-4, 1e-4)
    lines = []
    for peer, outs in independent.items():
        worst = max(float(np.abs(np.asarray(o, np.float64) - r).max()) for o, r in zip(outs, ref, strict=True))
        if not all(np.allclose(r, o, rtol=rtol, atol=atol) for o, r in zip(outs, ref)):
            raise SystemExit(f"{model.name}: TVM's LLVM build differs from {peer} (max |diff| {worst:.2e})")
        lines.append(f"{peer} max|diff| {worst:.1e}")
    if not lines:
        raise SystemExit(f"{model.name}: no independent reference here (install PyTorch)")
    return lines


def compile_for(model: Bundled, target: str) -> CompiledModel:
    """Ours, for the bundle's target (CUDA host code is generic: ``cuda_host_target``)."""
    tgt = CUDA if target == "cuda" else "llvm"
    if model.kind != "optimizer":
        return aicf_tvm.compile(model.mod, target=tgt)
    step = aicf_tvm.compile_optimizer_step(model.mod["main"], target=tgt)
    return compiled_model(step.executable, step.target, step.lowered["main"], report=step.report,
                          lowered=step.lowered)


def write_model(model: Bundled, target: str, out: Path) -> dict:
    start = time.perf_counter()
    arrays = arrays_of(model)
    ref = reference(model, arrays)
    checks = cross_check(model, arrays, ref)
    compiled = compile_for(model, target)
    compiled.export(out / "models" / f"{model.name}.so")
    rtol, atol = ADAM_TOLERANCE if model.kind == "optimizer" else TOLERANCE[target]
    entry = {"name": model.name, "kind": model.kind, "library": f"models/{model.name}.so", "inputs": [],
             "reference": [], "rtol": rtol, "atol": atol, **model.extra}
    if model.twin:
        entry["twin"] = model.twin
    generated = []
    for spec, array in zip(model.inputs, arrays):
        if "array" in spec:
            np.save(out / "data" / f"{model.name}.{spec['name']}.npy", array)
            entry["inputs"].append({"name": spec["name"], "file": f"data/{model.name}.{spec['name']}.npy"})
        else:
            entry["inputs"].append(spec)
            generated += [] if "fill" in spec else [array]
    entry["weights_sha256"] = runner.digest(generated)
    for i, value in enumerate(ref):
        file = f"data/{model.name}.out{i}.npy"
        if model.kind == "optimizer":
            np.save(out / file, value.reshape(-1)[runner.sample_indices(value.size, SAMPLES, SEED)])
            entry["reference"].append({"file": file, "sample": SAMPLES})
        else:
            np.save(out / file, value)
            entry["reference"].append({"file": file})
    print(f"  {model.name}: {len(compiled.kernels)} kernels, reference vs {', '.join(checks)}, "
          f"{time.perf_counter() - start:.1f} s", flush=True)
    return entry


def copy_runtime(target: str, out: Path) -> None:
    """TVM's runtime-only pieces and ``aicf_tvm`` into ``out/runtime``."""
    src, dest = Path(tvm.__file__).parent, out / "runtime" / "tvm"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in RUNTIME_PACKAGES:
        shutil.copytree(src / name, dest / name, ignore=ignore)
    (dest / "backend").mkdir(parents=True)
    for path in [*src.glob("*.py"), *(src / "backend").glob("*.py")]:
        shutil.copy2(path, dest / path.relative_to(src))
    for name in ("LICENSE", "NOTICE", "licenses"):
        (shutil.copytree if (src / name).is_dir() else shutil.copy2)(src / name, dest / name)
    libs = ["libtvm_runtime.so"] + (["libtvm_runtime_cuda.so"] if target == "cuda" else [])
    (dest / "lib").mkdir()
    for lib in libs:
        shutil.copy2(src / "lib" / lib, dest / "lib" / lib)
    if target == "cuda":  # its RUNPATH is $ORIGIN: the CUDA runtime it was linked with goes beside it
        shutil.copy2(_linked(src / "lib" / "libtvm_runtime_cuda.so", "libcudart.so"), dest / "lib")
    shutil.copytree(REPO / "aicf_tvm", out / "runtime" / "aicf_tvm", ignore=ignore)


def _linked(lib: Path, soname: str) -> Path:
    for line in subprocess.run(["ldd", str(lib)], capture_output=True, text=True, check=True).stdout.splitlines():
        name, _, where = line.strip().partition(" => ")
        if name.startswith(soname) and where.startswith("/"):
            return Path(where.split(" (")[0])
    raise SystemExit(f"{lib.name} links {soname}, which is not found here (install the CUDA toolkit)")


def download_wheels(python: str, with_numpy: bool, out: Path) -> None:
    wanted = [f"apache-tvm-ffi=={importlib.metadata.version('apache-tvm-ffi')}", "typing_extensions>=4.13"]
    wanted += ["numpy"] if with_numpy else []
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", python, "-d", str(out / "wheels"), *wanted]
    if subprocess.run(cmd, check=False).returncode:
        raise SystemExit(f"pip download failed for Python {python}: {' '.join(wanted)}")


RUN_SH = r"""#!/usr/bin/env bash
# Device check written by scripts/gpu_bundle.py: installs from this directory only, then
# runs every model against its reference and times it against PyTorch (when installed).
#   bash run.sh [--no-torch] [--no-torch-compile] [--models NAME ...] [--number N] [--repeat R]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
WANT=@PYTHON@
HAVE=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$HAVE" != "$WANT" ]; then
    echo "run.sh: this bundle is for Python $WANT, $PY is $HAVE (set PYTHON=python$WANT)" >&2
    exit 2
fi
for var in $(compgen -e); do case $var in PIP_*) unset "$var" ;; esac; done
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
if [ ! -e "$HERE/site/.installed" ]; then
    pkgs="apache-tvm-ffi typing_extensions"
    if ! "$PY" -c "import numpy" 2> /dev/null; then
        if ! ls "$HERE"/wheels/numpy-*.whl > /dev/null 2>&1; then
            echo "run.sh: $PY has no numpy and this bundle carries none (build it with --with-numpy)" >&2
            exit 2
        fi
        pkgs="$pkgs numpy"
    fi
    rm -rf "$HERE/site"
    if "$PY" -m pip --version > /dev/null 2>&1; then
        "$PY" -m pip install --quiet --no-index --find-links "$HERE/wheels" --target "$HERE/site" --no-compile $pkgs
    else  # no pip: these wheels are plain zips of their modules
        for pkg in $pkgs; do
            wheel=$(ls "$HERE"/wheels/$(echo "$pkg" | tr - _)-*.whl 2> /dev/null | head -n 1)
            [ -n "$wheel" ] || { echo "run.sh: no wheel for $pkg in $HERE/wheels" >&2; exit 2; }
            "$PY" -m zipfile -e "$wheel" "$HERE/site"
        done
    fi
    touch "$HERE/site/.installed"
fi
command -v nvidia-smi > /dev/null \
    && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
export PYTHONPATH="$HERE/site:$HERE/runtime${PYTHONPATH:+:$PYTHONPATH}" TVM_USE_RUNTIME_LIB=1 AICF_DEBUG=0
exec "$PY" "$HERE/runner.py" "$@"
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=["cuda", "llvm"], required=True)
    parser.add_argument("--python", required=True, metavar="X.Y", help="the target host's Python")
    parser.add_argument("--with-numpy", action="store_true", help="also carry numpy's wheel")
    parser.add_argument("--out", required=True, type=Path, help="the bundle directory (replaced)")
    parser.add_argument("--models", nargs="*", default=None, help="a subset (default: all four)")
    args = parser.parse_args()
    out: Path = args.out
    shutil.rmtree(out, ignore_errors=True)
    for sub in ("models", "data", "wheels"):
        (out / sub).mkdir(parents=True)
    streams = Streams()
    builders = {"encoder_layer": lambda: transformer("encoder_layer", encoder_layer, 12, streams),
                "decoder_block": lambda: transformer("decoder_block", decoder_block, 8, streams),
                "convnet": lambda: convnet(streams), "adam_step": lambda: adam(streams)}
    print(f"building {args.target} bundle in {out}", flush=True)
    entries = [write_model(build(), args.target, out) for name, build in builders.items()
               if not args.models or name in args.models]
    copy_runtime(args.target, out)
    download_wheels(args.python, args.with_numpy, out)
    shutil.copy2(SCRIPTS / "bundle_runner.py", out / "runner.py")
    (out / "run.sh").write_text(RUN_SH.replace("@PYTHON@", args.python))
    (out / "run.sh").chmod(0o755)
    host = describe(host_cpu_target())
    (out / "manifest.json").write_text(json.dumps(
        {"format": 1, "target": args.target, "python": args.python, "seed": SEED, "built_on": host,
         "tvm": tvm.__version__, "models": entries}, indent=1))
    files = [p for p in out.rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    largest = ", ".join(f"{p.relative_to(out)} {p.stat().st_size / 2**20:.1f}"
                        for p in sorted(files, key=lambda p: -p.stat().st_size)[:5])
    print(f"wrote {out}: {len(files)} files, {total / 2**20:.1f} MiB (largest, MiB: {largest})")
    if total > MAX_BYTES:
        print(f"gpu_bundle: {total / 2**20:.1f} MiB is over the {MAX_BYTES / 2**20:.0f} MiB limit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
