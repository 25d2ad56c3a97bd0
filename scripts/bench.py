"""Latency of our compiler against ONNX Runtime and TVM's own pipelines, one run, interleaved.

Usage::

    python -m scripts.bench [--budget B] [--models squeezenet resnet50 ...]
                            [--rounds 3] [--json bench.json] [--work-dir bench_tuning]

Peers per model: ONNX Runtime (CPU EP, as many threads as ours), TVM's default pipeline untuned
(``relax.get_default_pipeline``), TVM's ``static_shape_tuning_pipeline`` with B trials,
ours untuned (``aicf_tvm.compile``) and ours tuned with the same B trials
(``aicf_tvm.tune`` then ``compile(database=...)``).  ``--budget 0`` (default) skips the
tuned peers.  Models: the ``onnx`` wheel's light squeezenet, shufflenet, resnet50,
inception_v1, densenet121, and the built-in encoder_layer / decoder_block (ONNX Runtime
runs their ``models_onnx.to_onnx`` twins; a model whose twin fails is benchmarked
without ratios, with a note).  Every peer is built first; then ``--rounds`` rounds each
time every peer once per model in turn, so a neighbour stealing a core hurts all peers
alike; the median is reported.  Inputs come from ``np.random.default_rng(0)``; ours is
checked against ONNX Runtime (rtol 1e-3, atol 1e-4) and marked ``MISMATCH`` when not.
All TVM peers compile for the same target: this host's CPU (``resolve_target("llvm")``).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

LIGHT = ("squeezenet", "shufflenet", "resnet50", "inception_v1", "densenet121")
BUILTIN = ("encoder_layer", "decoder_block")
PEERS = ("ort", "tvm", "tvm_tuned", "ours", "ours_tuned")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=[*LIGHT, *BUILTIN])
    parser.add_argument("--budget", type=int, default=0, help="tuning trials per model (0: skip tuned peers)")
    parser.add_argument("--rounds", type=int, default=3, help="timed calls per peer (median)")
    parser.add_argument("--json", default="bench.json", help="where to write the results")
    parser.add_argument("--work-dir", default=None, help="tuning work dirs (default: a temp dir)")
    return parser.parse_args()


ARGS = parse_args()

import tvm
from tvm import relax

import aicf_tvm
from aicf_tvm.runtime.targets import describe, resolve_target
from aicf_tvm.runtime.threads import thread_count, use_threads

TARGET = resolve_target("llvm")
# What ours runs with (TVM_NUM_THREADS, else every usable CPU); TVM's own peers run on this
# thread's pool, sized the same here, and ONNX Runtime gets as many.
THREADS = use_threads(thread_count(None, TARGET.export()))
Runner = Callable[[], list[np.ndarray]]


def light_path(name: str) -> Path:
    import onnx

    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"


def load(name: str) -> tuple[tvm.IRModule, bytes | None, str]:
    """The Relax module, the ONNX bytes for ONNX Runtime (None: no twin) and a note."""
    from aicf_tvm.driver.models import BUILTIN_MODELS

    if name in BUILTIN_MODELS:
        mod = aicf_tvm.load_model(name)
        try:
            from aicf_tvm.driver.models_onnx import to_onnx

            return mod, to_onnx(name), ""
        except Exception as err:  # noqa: BLE001 - benchmark without ONNX Runtime, say why
            return mod, None, f"no ONNX twin ({type(err).__name__}: {err}); ratios unavailable"
    path = light_path(name)
    return aicf_tvm.from_onnx(str(path)), path.read_bytes(), ""


def inputs_of(mod: tvm.IRModule) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal([int(d) for d in p.ty.shape.values]).astype(str(p.ty.dtype))
            for p in mod["main"].params]


def ort_runner(onnx_bytes: bytes, args: list[np.ndarray]) -> Runner:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = THREADS, 1
    sess = ort.InferenceSession(onnx_bytes, opts, providers=["CPUExecutionProvider"])
    feeds = {i.name: a for i, a in zip(sess.get_inputs(), args)}
    return lambda: sess.run(None, feeds)


def vm_runner(ex: Any, args: list[np.ndarray]) -> Runner:
    vm = relax.VirtualMachine(ex, tvm.cpu())
    tensors = [tvm.runtime.tensor(a) for a in args]

    def run() -> list[np.ndarray]:
        out = vm["main"](*tensors)
        outs = [out] if hasattr(out, "numpy") else list(out)
        return [o.numpy() for o in outs]

    return run


def tvm_runner(mod: tvm.IRModule, args: list[np.ndarray], budget: int, work_dir: str) -> Runner:
    if budget:
        tuned = relax.pipeline.static_shape_tuning_pipeline(
            total_trials=budget, target=TARGET, work_dir=work_dir)(mod)
        mod = tuned
    ex = tvm.compile(mod, target=TARGET, relax_pipeline=relax.get_default_pipeline(TARGET))
    return vm_runner(ex, args)


def ours_runner(mod: tvm.IRModule, args: list[np.ndarray], budget: int, work_dir: str) -> Runner:
    database = None
    if budget:
        aicf_tvm.tune(mod, TARGET, trials=budget, work_dir=work_dir, progress=False)
        database = work_dir
    compiled = aicf_tvm.compile(mod, TARGET, database=database)
    return lambda: [compiled(*args)] if len(compiled.outputs) == 1 else list(compiled(*args))


def raise_builder_timeout(seconds: float) -> None:
    """Give TVM's own tuning the builder timeout ours gets (docs/design.md §9: 30 s fails here)."""
    from tvm.s_tir.meta_schedule.builder import LocalBuilder

    kwdefaults = dict(LocalBuilder.__init__.__kwdefaults__ or {})
    kwdefaults["timeout_sec"] = seconds
    LocalBuilder.__init__.__kwdefaults__ = kwdefaults


def build_peers(name: str, work_root: Path) -> dict:
    """Everything for one model: its runners per peer, inputs and notes."""
    mod, onnx_bytes, note = load(name)
    args = inputs_of(mod)
    entry: dict = {"runners": {}, "notes": [note] if note else [], "build_s": {}}
    makers: dict[str, Callable[[], Runner]] = {
        "ort": (lambda: ort_runner(onnx_bytes, args)) if onnx_bytes is not None else None,
        "tvm": lambda: tvm_runner(mod, args, 0, ""),
        "tvm_tuned": lambda: tvm_runner(mod, args, ARGS.budget, str(work_root / f"tvm_{name}")),
        "ours": lambda: ours_runner(mod, args, 0, ""),
        "ours_tuned": lambda: ours_runner(mod, args, ARGS.budget, str(work_root / f"ours_{name}")),
    }
    for peer in PEERS:
        if makers[peer] is None or (peer.endswith("_tuned") and not ARGS.budget):
            continue
        start = time.perf_counter()
        try:
            run = makers[peer]()
            run()  # warm-up (and the first-call allocations)
            entry["runners"][peer] = run
        except Exception as err:  # noqa: BLE001 - report and keep benchmarking the others
            entry["notes"].append(f"{peer} failed: {type(err).__name__}: {str(err).strip()[:200]}")
            traceback.print_exc(limit=2)
        entry["build_s"][peer] = round(time.perf_counter() - start, 1)
        print(f"  built {name}/{peer} in {entry['build_s'][peer]} s", flush=True)
    return entry


def check(entry: dict) -> bool | None:
    runners = entry["runners"]
    if "ort" not in runners or "ours" not in runners:
        return None
    ref, got = runners["ort"](), runners["ours"]()
    return len(ref) == len(got) and all(
        np.allclose(g, r, rtol=1e-3, atol=1e-4) for g, r in zip(got, ref))


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def main() -> None:
    work_root = Path(ARGS.work_dir or tempfile.mkdtemp(prefix="aicf_bench_"))
    print(f"target: {describe(TARGET)}, {THREADS} threads; budget B={ARGS.budget}; rounds={ARGS.rounds}", flush=True)
    if ARGS.budget:
        raise_builder_timeout(300.0)
    entries = {}
    for name in ARGS.models:
        print(f"building {name}", flush=True)
        entries[name] = build_peers(name, work_root)
    times: dict[str, dict[str, list[float]]] = {n: {p: [] for p in e["runners"]} for n, e in entries.items()}
    for rnd in range(ARGS.rounds):  # interleaved: every peer of every model, round by round
        for name, entry in entries.items():
            for peer, run in entry["runners"].items():
                start = time.perf_counter()
                run()
                times[name][peer].append(time.perf_counter() - start)
        print(f"round {rnd + 1}/{ARGS.rounds} done", flush=True)
    report = {"target": describe(TARGET), "threads": THREADS, "budget": ARGS.budget, "rounds": ARGS.rounds,
              "models": {}}
    for name, entry in entries.items():
        ms = {p: float(np.median(t)) * 1e3 for p, t in times[name].items()}
        base = ms.get("ort")
        ratios = {p: v / base for p, v in ms.items() if p != "ort"} if base else {}
        report["models"][name] = {"ms": ms, "ratio_to_ort": ratios, "ours_matches_ort": check(entry),
                                  "build_s": entry["build_s"], "notes": entry["notes"]}
    report["geomean_ratio_to_ort"] = {
        p: geomean([m["ratio_to_ort"][p] for m in report["models"].values() if p in m["ratio_to_ort"]])
        for p in PEERS[1:]}
    print_table(report)
    Path(ARGS.json).write_text(json.dumps(report, indent=1))
    print(f"wrote {ARGS.json}")


def print_table(report: dict) -> None:
    peers = [p for p in PEERS[1:] if report["geomean_ratio_to_ort"].get(p) is not None]
    head = f"{'model':20s} {'ORT ms':>9s} " + " ".join(f"{p + ' (x)':>18s}" for p in peers) + "  check"
    print(head)
    print("-" * len(head))
    for name, m in report["models"].items():
        ort = m["ms"].get("ort")
        cells = []
        for p in peers:
            r, v = m["ratio_to_ort"].get(p), m["ms"].get(p)
            cells.append((f"{(f'{v:.2f}ms ' if v is not None else '')}"
                          f"{f'{r:.2f}' if r is not None else '-':>5s}").rjust(18))
        mark = {True: "ok", False: "MISMATCH", None: "n/a"}[m["ours_matches_ort"]]
        print(f"{name:20s} {f'{ort:.2f}' if ort else '-':>9s} " + " ".join(cells) + f"  {mark}")
        for note in m["notes"]:
            print(f"    note: {note}")
    geo = report["geomean_ratio_to_ort"]
    print(f"{'geomean':20s} {'':>9s} " + " ".join(f"{geo[p]:18.2f}" for p in peers))
    if geo.get("tvm") and geo.get("ours"):
        print(f"ours untuned vs TVM default untuned: {geo['tvm'] / geo['ours']:.1f}x faster (geomean)")


if __name__ == "__main__":
    main()
