"""ONNX conformance: every test case shipped in the onnx wheel, through AICF and through TVM.

    python -m scripts.conformance [--suite light ...] [--json results.json] [--write-lock]
                                  [--timeout 300] [--filter SUBSTRING]

Suites (``onnx/backend/test/data/``): ``pytorch-converted``, ``pytorch-operator``,
``simple`` (a case is a directory with ``model.onnx`` and ``test_data_set_*/{input,output}_*.pb``)
and ``light`` (real architectures; like ONNX's own runner we feed ``arange(n)/n`` inputs, with
unknown dims set to 1, and compare against the shipped ``light_*_output_0.pb``).

Each case is imported once with TVM's ONNX frontend (the shapes of its test inputs pinned)
and then built twice: by ``aicf_tvm.compile`` and by ``tvm.compile`` with
``relax.get_default_pipeline`` (TVM's own). Verdicts per pipeline:

* ``pass``        every output of every data set matches (rtol 1e-3 as ONNX's runner;
                  atol 1e-6 rather than ONNX's 1e-7, for float32 accumulation order)
* ``wrong``       it ran and an output differs (value, shape or dtype)
* ``unsupported`` the ONNX frontend cannot import the model (same for both pipelines), or
                  the test data cannot be read (sequence/optional inputs)
* ``error``       the import worked but the pipeline raised, crashed or timed out

Cases run in a worker process (a fatal abort inside TVM is an ``error`` for that case,
not the end of the run).

``--write-lock`` records the cases ours passes in ``tests/data/conformance_pass.json``
(``{"onnx": version, "cases": [...]}``, read by ``tests/test_conformance_lock.py``, which
pins their number). The lock only grows: cases outside the run stay locked, and a locked
case that the run does not pass (or that the installed wheel no longer has) is named and
the lock left unchanged, unless ``--allow-drop`` says the loss is meant. Under another
onnx version than the lock's, only a full run (every suite, no filter) may write it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SUITES = ("pytorch-converted", "pytorch-operator", "simple", "light")
LOCK = ROOT / "tests" / "data" / "conformance_pass.json"
RTOL, ATOL = 1e-3, 1e-6
TARGET = {"kind": "llvm", "num-cores": 2}


def data_dir() -> Path:
    import onnx

    return Path(onnx.__file__).parent / "backend" / "test" / "data"


def list_cases(suites: tuple[str, ...] = SUITES) -> list[str]:
    """Case names ``suite/name``, sorted."""
    root, out = data_dir(), []
    for suite in suites:
        if suite == "light":
            out += [f"light/{p.stem.removeprefix('light_')}" for p in sorted((root / suite).glob("light_*.onnx"))]
        else:
            out += [f"{suite}/{p.name}" for p in sorted((root / suite).iterdir()) if (p / "model.onnx").exists()]
    return out


def _read_tensor(path: Path) -> np.ndarray:
    import onnx
    from onnx import numpy_helper

    t = onnx.TensorProto()
    t.ParseFromString(path.read_bytes())
    if not t.dims and not t.raw_data and not any(
            getattr(t, f) for f in ("float_data", "int32_data", "int64_data", "double_data", "string_data")):
        raise ValueError(f"{path.name}: not a plain tensor (sequence/optional data)")
    return numpy_helper.to_array(t)


def load_case(name: str):
    """(model, [(inputs, outputs)]) of a case; raises ValueError for unreadable test data."""
    import onnx

    suite, case = name.split("/", 1)
    root = data_dir() / suite
    if suite == "light":
        model = onnx.load(root / f"light_{case}.onnx")
        inits = {i.name for i in model.graph.initializer}
        inputs = []
        for x in model.graph.input:
            if x.name in inits:
                continue
            shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in x.type.tensor_type.shape.dim)
            n = int(np.prod(shape))
            inputs.append((np.arange(n).reshape(shape) / n).astype(np.float32))
        return model, [(inputs, [_read_tensor(root / f"light_{case}_output_0.pb")])]
    model = onnx.load(root / case / "model.onnx")
    sets = []
    for d in sorted((root / case).glob("test_data_set_*")):
        ins = [_read_tensor(p) for p in sorted(d.glob("input_*.pb"), key=lambda p: int(p.stem.split("_")[1]))]
        outs = [_read_tensor(p) for p in sorted(d.glob("output_*.pb"), key=lambda p: int(p.stem.split("_")[1]))]
        sets.append((ins, outs))
    return model, sets


def _compare(got: list, want: list) -> str | None:
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        if g.shape != w.shape:
            return f"output {k}: shape {g.shape}, expected {w.shape}"
        if g.dtype != w.dtype:
            return f"output {k}: dtype {g.dtype}, expected {w.dtype}"
        if w.dtype == bool or not np.issubdtype(w.dtype, np.number):
            if not np.array_equal(g, w):
                return f"output {k}: values differ"
        elif not np.allclose(g.astype(np.float64), w.astype(np.float64), rtol=RTOL, atol=ATOL, equal_nan=True):
            diff = np.nanmax(np.abs(g.astype(np.float64) - w.astype(np.float64)))
            return f"output {k}: max |diff| {diff:.3g}"
    return None


def _outputs(out) -> list:
    if hasattr(out, "numpy"):
        return [out.numpy()]
    if isinstance(out, (list, tuple)) or type(out).__name__ == "Array":
        flat = []
        for o in out:
            flat += _outputs(o)
        return flat
    return [np.asarray(out)]


def _run_tvm(mod, sets) -> list:
    import tvm
    from tvm import relax

    target = tvm.target.Target(TARGET)
    ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return [_outputs(vm["main"](*[tvm.runtime.tensor(a) for a in ins])) for ins, _ in sets]


def _run_ours(mod, sets) -> list:
    import aicf_tvm

    model = aicf_tvm.compile(mod, target=TARGET)
    results = []
    for ins, _ in sets:
        out = model(*ins)
        results.append(_outputs(out if isinstance(out, list) else [out]))
    return results


class CaseTimeout(BaseException):
    """A pipeline ran past its time (BaseException: no ``except Exception`` swallows it)."""


def _on_alarm(*_) -> None:
    raise CaseTimeout


def run_case(name: str, pipelines: tuple[str, ...] = ("ours", "tvm"), timeout: int = 0) -> dict:
    """The verdict of each pipeline on one case, with a one-line reason when not ``pass``.
    ``timeout`` > 0: seconds per pipeline (SIGALRM; main thread only)."""
    import aicf_tvm

    result: dict = {"case": name}
    try:
        model, sets = load_case(name)
        shapes = {}
        inits = {i.name for i in model.graph.initializer}
        real = [x.name for x in model.graph.input if x.name not in inits]
        for k, x in enumerate(real):
            if sets and k < len(sets[0][0]):
                shapes[x] = list(sets[0][0][k].shape)
        mod = aicf_tvm.from_onnx(model, shapes=shapes)
    except Exception as err:  # noqa: BLE001 - every import failure is "unsupported"
        reason = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200] if str(err).strip() else ''}"
        return {**result, **{p: "unsupported" for p in pipelines}, "reason": reason}
    for pipe in pipelines:
        if timeout:
            signal.signal(signal.SIGALRM, _on_alarm)
            signal.alarm(timeout)
        try:
            got = (_run_ours if pipe == "ours" else _run_tvm)(mod, sets)
        except CaseTimeout:
            result[pipe], result[f"{pipe}_reason"] = "error", f"timeout: over {timeout} s"
            continue
        except Exception as err:  # noqa: BLE001
            msg = str(err).strip().splitlines()
            result[pipe], result[f"{pipe}_reason"] = "error", f"{type(err).__name__}: {msg[0][:200] if msg else ''}"
            continue
        finally:
            signal.alarm(0)
        bad = next((r for r in (_compare(g, outs) for g, (_, outs) in zip(got, sets)) if r), None)
        result[pipe] = "wrong" if bad else "pass"
        if bad:
            result[f"{pipe}_reason"] = bad
    return result


def _worker(cases: list[str], timeout: int) -> None:
    """Child: run cases in order, one JSON line each ("start" first, so a crash is known)."""
    for name in cases:
        print(json.dumps({"start": name}), flush=True)
        print(json.dumps(run_case(name, timeout=timeout)), flush=True)


def run_all(cases: list[str], timeout: int, log=print) -> list[dict]:
    """Run cases in worker processes, restarting after a crash."""
    results: dict[str, dict] = {}
    todo = list(cases)
    while todo:
        proc = subprocess.Popen([sys.executable, __file__, "--worker", "--timeout", str(timeout), *todo],
                                stdout=subprocess.PIPE, text=True, env=dict(os.environ, AICF_DEBUG="0"))
        current = None
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            data = json.loads(line)
            if "start" in data:
                current = data["start"]
                continue
            results[data["case"]] = data
            log(_line(data))
            current = None
        proc.wait()
        if current is not None:
            data = {"case": current, "ours": "error", "tvm": "error", "reason": f"process died ({proc.returncode})"}
            results[current] = data
            log(_line(data))
        todo = [c for c in cases if c not in results]
        if current is None and todo:  # the worker ended without a verdict for the rest
            for c in todo:
                results[c] = {"case": c, "ours": "error", "tvm": "error", "reason": "worker stopped"}
            todo = []
    return [results[c] for c in cases]


def read_lock(path: Path = LOCK) -> dict:
    """``{"onnx": version or None, "cases": [...]}``; an absent lock is empty."""
    if not path.exists():
        return {"onnx": None, "cases": []}
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list) or "onnx" not in data:
        raise SystemExit(f"{path}: not a conformance lock (expected {{\"onnx\": ..., \"cases\": [...]}})")
    return data


def updated_lock(lock: dict, results: list[dict], available: list[str], onnx_version: str,
                 full_run: bool) -> tuple[dict, list[str]]:
    """(the new lock, one line per locked case it would drop). Cases the run did not cover
    stay locked; passing cases are added."""
    if lock["onnx"] not in (None, onnx_version) and not full_run:
        raise SystemExit(f"the lock was written with onnx {lock['onnx']}, onnx {onnx_version} is installed: "
                         "only a full run (no --suite, no --filter) may rewrite it")
    verdicts = {r["case"]: r for r in results}
    present = set(available)
    drops = []
    for case in lock["cases"]:
        if case not in present:
            drops.append(f"{case}: not in the test data of onnx {onnx_version}")
        elif case in verdicts and verdicts[case]["ours"] != "pass":
            r = verdicts[case]
            drops.append(f"{case}: ours={r['ours']} {r.get('ours_reason') or r.get('reason') or ''}".rstrip())
    kept = {c for c in lock["cases"] if c in present and (c not in verdicts or verdicts[c]["ours"] == "pass")}
    passing = {r["case"] for r in results if r["ours"] == "pass"}
    return {"onnx": onnx_version, "cases": sorted(kept | passing)}, drops


def write_lock(results: list[dict], full_run: bool, allow_drop: bool, path: Path = LOCK) -> bool:
    """Update the lock from ``results``; False (lock unchanged) when it would drop a case
    that ``allow_drop`` does not allow."""
    import onnx

    new, drops = updated_lock(read_lock(path), results, list_cases(), onnx.__version__, full_run)
    for line in drops:
        print(f"lock: drops {line}", file=sys.stderr)
    if drops and not allow_drop:
        print(f"lock: {len(drops)} locked case(s) would drop; {path} left unchanged "
              "(--allow-drop writes it anyway)", file=sys.stderr)
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(new, indent=1) + "\n")
    print(f"lock: {len(new['cases'])} cases (onnx {new['onnx']}) in {path}")
    return True


def _line(r: dict) -> str:
    why = r.get("reason") or r.get("ours_reason") or r.get("tvm_reason") or ""
    return f"{r['case']:<60} ours={r['ours']:<12} tvm={r['tvm']:<12} {why[:120]}"


def summary(results: list[dict]) -> str:
    lines = [f"{'suite':<18} {'pipeline':<8} {'pass':>5} {'wrong':>6} {'unsupported':>12} {'error':>6}"]
    for suite in SUITES:
        rs = [r for r in results if r["case"].startswith(suite + "/")]
        if not rs:
            continue
        for pipe in ("ours", "tvm"):
            c = Counter(r[pipe] for r in rs)
            lines.append(f"{suite:<18} {pipe:<8} {c['pass']:>5} {c['wrong']:>6} {c['unsupported']:>12} {c['error']:>6}")
    worse = [r["case"] for r in results if r["tvm"] == "pass" and r["ours"] != "pass"]
    lines.append(f"TVM passes, ours does not: {len(worse)}" + (": " + ", ".join(worse) if worse else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", action="append", choices=SUITES)
    ap.add_argument("--filter", default="")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per pipeline per case")
    ap.add_argument("--json", type=Path, help="write every verdict here")
    ap.add_argument("--write-lock", action="store_true", help=f"add the cases ours passes to {LOCK}")
    ap.add_argument("--allow-drop", action="store_true",
                    help="with --write-lock: write the lock even if locked cases no longer pass")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("cases", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(args.cases, args.timeout)
        return 0
    cases = [c for c in list_cases(tuple(args.suite or SUITES)) if args.filter in c]
    start = time.monotonic()
    results = run_all(cases, args.timeout)
    print(summary(results))
    print(f"{len(results)} cases in {time.monotonic() - start:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.write_lock and not write_lock(results, full_run=not args.suite and not args.filter,
                                          allow_drop=args.allow_drop):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
