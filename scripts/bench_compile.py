"""How long a user waits: import, compile, first call, export and load, per model.

Usage::

    python -m scripts.bench_compile [--models bert resnet50 ...] [--paths onnx torch] [--shared-cache]
                                    [--json bench_compile.json]

Each row is three fresh processes, as a user runs them (the default target, no other
environment variable than the compile cache's folder, which points at an empty folder
of the run so that "cold" is cold): the ONNX file is written beforehand by
``torch.onnx.export`` (``scripts.bench_peers.onnx_file``, not timed) and compiled by path
(``aicf_tvm.compile("model.onnx")``); the PyTorch path times ``aicf_tvm.from_torch``.

* ``nocache``: ``from_torch(cache=False)`` and ``compile(cache=False)``: import and
  compile (its phases, ``model.timings``), the first call and the median of 10 later
  ones (output checked against PyTorch eager; two inputs must give two outputs),
  ``export`` to a library, then ``aicf_tvm.load`` and ``tvm.runtime.load_module`` of it
  (3 times each, alternating, each in a new process; the medians), and ``load_module``
  of the model exported with its weights inside the executable (TVM's layout: what
  TVM's loader deserializes); for the ONNX path also the seconds ONNX Runtime takes to
  create a session on the same file.
* ``cold``: the compile cache (and ``from_torch``'s import cache) on and empty: import
  + compile (with the cache's export) + first call; then ``export`` as a user of the
  default compile exports.
* ``warm``: the same in a new process, the cache now holding the model.

``--shared-cache``: one cache folder for every row, so that ``cold`` is this model's
first compile with the models before it in the cache (``--models bert roberta``:
RoBERTa after BERT, whose kernels' schedules it shares).

Printed per model and path: import, compile and first call without the cache, first /
steady, export (without the cache: code generated again), the cold total and then its
export (the default: the cache's library copied), the warm total, load, load /
load_module of the same file and of the weights-inside library, ORT's session time; the
CPU's ISA in the header.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from scripts.harness import SEQ, build, model_name

DEFAULT_MODELS = ("bert", "gpt2", "vit", "resnet50", "mobilenetv2")


def _one(name: str, path: str, work: Path, mode: str) -> dict[str, Any]:
    """The child: ``mode`` (``nocache``, ``cold``, ``warm``) of ``name`` through ``path``.
    Python's ``import tvm`` (about 1.3 s) is done before any clock starts, as ONNX Runtime's
    import is before its session's."""
    import tvm  # noqa: F401 - imported before the clock (docstring)

    import aicf_tvm
    from scripts.bench_peers import _first, _numpy, eager

    model = build(name, SEQ)
    args = _numpy(model)
    out: dict[str, Any] = {"model": name, "path": path, "mode": mode}
    start = time.perf_counter()
    if path == "onnx":
        compiled = aicf_tvm.compile(str(work / f"{name}.onnx"), cache=mode != "nocache")
        out["phases"] = dict(compiled.timings)
    else:
        mod = aicf_tvm.from_torch(model.module, model.inputs, cache=mode != "nocache")
        imported = time.perf_counter() - start
        compiled = aicf_tvm.compile(mod, cache=mode != "nocache")
        out["phases"] = {"import": imported, **compiled.timings}
    out["compile_s"] = time.perf_counter() - start  # import included
    start = time.perf_counter()
    y = np.asarray(_first(compiled(*args)))
    out["first_call_s"] = time.perf_counter() - start
    out["total_s"] = out["compile_s"] + out["first_call_s"]
    ref = eager(model, 0, work)()  # the harness's modules return one tensor
    out["max_rel_err"] = float(np.abs(y - ref).max() / max(np.abs(ref).max(), 1e-30))
    other = list(args)
    other[0] = (args[0] * 0.5 + 1.0).astype(args[0].dtype) if args[0].dtype.kind == "f" else (args[0] + 7) % 100
    out["input_dependent"] = not np.array_equal(np.asarray(_first(compiled(*other))), y)
    if mode == "cold":  # the export a user gets by default: the cache's library, copied
        lib = work / f"{name}-{path}-cached.so"
        start = time.perf_counter()
        compiled.export(lib)
        out["export_s"] = time.perf_counter() - start
        lib.unlink()
    if mode != "nocache":
        return out
    steady = []
    for _ in range(10):
        start = time.perf_counter()
        compiled(*args)
        steady.append(time.perf_counter() - start)
    out["steady_call_s"] = statistics.median(steady)
    lib = work / f"{name}-{path}.so"
    start = time.perf_counter()
    compiled.export(lib)
    out["export_s"] = time.perf_counter() - start
    from aicf_tvm.runtime.deploy import export

    inside = export(compiled, work / f"{name}-{path}-inside.so", mapped=False)  # TVM's layout: weights inside
    loads, raw, raw_inside = [], [], []
    for _ in range(3):  # each in a process of its own, as a user loads: a library mapped before is another case
        raw.append(_load_in_fresh_process(lib, "tvm.runtime.load_module(path)"))
        raw_inside.append(_load_in_fresh_process(inside, "tvm.runtime.load_module(path)"))
        loads.append(_load_in_fresh_process(lib, "aicf_tvm.load(path)"))
    out["load_s"], out["load_module_s"] = statistics.median(loads), statistics.median(raw)
    out["load_module_inside_s"] = statistics.median(raw_inside)
    inside.unlink()
    if path == "onnx":
        import onnxruntime as ort

        start = time.perf_counter()
        ort.InferenceSession(str(work / f"{name}.onnx"), providers=["CPUExecutionProvider"])
        out["ort_session_s"] = time.perf_counter() - start
    lib.unlink()
    return out


def _load_in_fresh_process(lib: Path, call: str) -> float:
    """Seconds ``call`` (with ``path`` the library) takes in a new interpreter, its imports
    done before the clock starts."""
    code = ("import sys, time, tvm, aicf_tvm, aicf_tvm.runtime.compiled; path = sys.argv[1]; "
            f"start = time.perf_counter(); {call}; print('SECONDS', time.perf_counter() - start)")
    proc = subprocess.run([sys.executable, "-c", code, str(lib)], check=True, capture_output=True, text=True)
    return float(next(ln for ln in proc.stdout.splitlines() if ln.startswith("SECONDS ")).split()[1])


def _child(name: str, path: str, work: Path, mode: str, cache: Path) -> dict[str, Any]:
    env = {**os.environ, "AICF_CACHE_DIR": str(cache)}
    proc = subprocess.run([sys.executable, "-m", "scripts.bench_compile", "--one", name, path, str(work), mode],
                          check=False, capture_output=True, text=True, env=env)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{name} {path} {mode}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(line[len("RESULT "):])


def _isa() -> str:
    from aicf_tvm.runtime.cpu_features import target_isa
    from aicf_tvm.runtime.targets import describe, resolve_target

    target = resolve_target("llvm")
    flags = set(target_isa(target.export()))
    isa = "AVX-512" if any(f.startswith("avx512") for f in flags) else "AVX2" if "avx2" in flags else "other"
    return f"{isa} ({describe(target)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", type=model_name, default=list(DEFAULT_MODELS))
    parser.add_argument("--paths", nargs="+", choices=("onnx", "torch"), default=["onnx", "torch"])
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--shared-cache", action="store_true", help="one cache folder for every row (docstring)")
    parser.add_argument("--one", nargs=4, metavar=("MODEL", "PATH", "WORK", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        name, path, work, mode = args.one
        print("RESULT " + json.dumps(_one(name, path, Path(work), mode)))
        return
    from scripts.bench_peers import onnx_file

    print(f"# bench_compile on {_isa()}; each row three fresh processes (no cache, cold cache, warm cache)"
          + ("; one cache for every row: cold = with the rows before it cached" if args.shared_cache else ""),
          flush=True)
    print(f"{'model':<12} {'path':<5} {'import':>7} {'compile':>8} {'first':>6} {'first/':>7} {'export':>7} "
          f"{'cold':>6} {'export':>7} {'warm':>6} {'load':>6} {'load/':>7} {'load/':>7} {'ORT':>6}\n"
          f"{'':<12} {'':<5} {'s':>7} {'s':>8} {'s':>6} {'steady':>7} {'s':>7} "
          f"{'s':>6} {'cold s':>7} {'s':>6} {'s':>6} {'ld_mod':>7} {'inside':>7} {'sess s':>6}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="aicf-bench-compile-") as tmp:
        for name in args.models:
            for path in args.paths:
                work = Path(tmp) / f"{name}-{path}"
                work.mkdir()
                if path == "onnx":
                    onnx_file(build(name, SEQ), work)
                try:
                    cache = Path(tmp) / "cache" if args.shared_cache else work / "cache"
                    runs = {mode: _child(name, path, work, mode, cache) for mode in ("nocache", "cold", "warm")}
                except RuntimeError as err:
                    print(f"{name:<12} {path:<5} FAILED: {err}", flush=True)
                    continue
                rows.append(runs)
                r, phases = runs["nocache"], runs["nocache"]["phases"]
                ok = all(x["max_rel_err"] <= 1e-3 and x["input_dependent"] for x in runs.values())
                imported = phases.get("import", 0.0)
                print(f"{name:<12} {path:<5} {imported:7.2f} {r['compile_s'] - imported:8.2f} {r['first_call_s']:6.3f} "
                      f"{r['first_call_s'] / r['steady_call_s']:7.2f} {r['export_s']:7.2f} "
                      f"{runs['cold']['total_s']:6.2f} {runs['cold']['export_s']:7.2f} "
                      f"{runs['warm']['total_s']:6.2f} {r['load_s']:6.2f} "
                      f"{r['load_s'] / r['load_module_s']:7.2f} {r['load_s'] / r['load_module_inside_s']:7.2f} "
                      f"{r.get('ort_session_s', float('nan')):6.2f}"
                      f"{'' if ok else '  MISMATCH'}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"isa": _isa(), "shared_cache": args.shared_cache, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
