"""Where the time goes, ours beside OpenVINO and ONNX Runtime, by class of operation:
``python -m scripts.profile_peers MODEL [MODEL ...]``.

MODEL is a model of ``scripts/bench_peers.py`` (``bert``, ``resnet50@299``, ``whisper``, ...).
All three engines run the same inputs on the same thread count in ONE process:

* ours: ``aicf_tvm.compile`` of ``from_torch``, each kernel call timed inside the model (a VM
  instrument around every call, the median over ``--runs`` calls), summed per kernel;
* OpenVINO: the ONNX file of ``bench_peers`` with ``PERF_COUNT`` on, each executed layer's
  ``real_time`` (median over the runs);
* ONNX Runtime: the same file with its profiler on, each node's ``kernel_time`` event
  (median over the runs).

Each engine's layers are put in classes by name (``gemm``: matmul / fully connected /
dense; ``conv``; ``depthwise``; ``attention``; ``norm``; ``other``), so the table shows
which class of kernel one engine runs slower than another; then each engine's slowest
layers. An instrumented call is slower than a plain one (the sum is printed beside the
plain call's median): compare classes, not the last percent.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from scripts import bench_peers, harness

CLASSES = ("gemm", "conv", "depthwise", "attention", "norm", "other")


def op_class(name: str) -> str:
    """The class of a layer by its kind or type name (any engine's spelling)."""
    low = name.lower()
    if "depthwise" in low or "groupconv" in low or "dwconv" in low:
        return "depthwise"
    if "attention" in low or "softmax" in low or "sdpa" in low or "multiheadattention" in low:
        return "attention"
    if "conv" in low:
        return "conv"
    if re.search(r"matmul|gemm|fullyconnected|dense|linear|inner_?product", low):  # ours: kind/rule
        return "gemm"
    if "norm" in low or "mvn" in low or "reducemean" in low:
        return "norm"
    return "other"


def profile_ours(model: harness.Model, threads: int, runs: int) -> tuple[dict[str, tuple[str, float]], float]:
    """(kernel -> (kind/rule, ms per inference)), median ms of a plain call."""
    import aicf_tvm
    from relax_passes.lower_emits import kernel_calls
    from scripts.profile_kernels import time_in_model

    compiled = aicf_tvm.compile(aicf_tvm.from_torch(model.module, model.inputs), target="llvm",
                                threads=threads, cache=False)
    calls = collections.Counter(kernel_calls(compiled.lowered["main"]))
    kinds = {k.name: f"{k.kind}/{k.schedule}" for k in compiled.kernels}  # a generic group by its rule
    per_call, whole = time_in_model(compiled, calls, runs)
    rows = {name: (kinds.get(name, name), secs * calls[name] * 1e3) for name, secs in per_call.items()}
    return rows, (whole or float("nan")) * 1e3


def profile_openvino(model: harness.Model, path: Path, threads: int,
                     runs: int) -> tuple[dict[str, tuple[str, float]], float]:
    _, request, feeds = bench_peers.openvino_request(model, path, threads, perf_count=True)
    for _ in range(3):
        request.infer(feeds)
    per_run: dict[str, list[float]] = collections.defaultdict(list)
    types: dict[str, str] = {}
    plain = []
    for _ in range(runs):
        start = time.perf_counter()
        request.infer(feeds)
        plain.append(time.perf_counter() - start)
        for info in request.profiling_info:
            if str(info.status).endswith("EXECUTED"):
                per_run[info.node_name].append(info.real_time.total_seconds())
                types[info.node_name] = f"{info.node_type}/{info.exec_type}"
    rows = {name: (types[name], statistics.median(v) * 1e3) for name, v in per_run.items()}
    return rows, statistics.median(plain) * 1e3


def profile_ort(model: harness.Model, path: Path, threads: int,
                runs: int) -> tuple[dict[str, tuple[str, float]], float]:
    sess, feeds = bench_peers.ort_session(model, path, threads, profile_prefix=str(Path(tempfile.mkdtemp()) / "ort"))
    for _ in range(3):
        sess.run(None, feeds)
    plain = []
    for _ in range(runs):
        start = time.perf_counter()
        sess.run(None, feeds)
        plain.append(time.perf_counter() - start)
    events = json.loads(Path(sess.end_profiling()).read_text())
    per_node: dict[str, list[float]] = collections.defaultdict(list)
    types: dict[str, str] = {}
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            node = event["name"][: -len("_kernel_time")]
            per_node[node].append(event["dur"] / 1e3)
            types[node] = event.get("args", {}).get("op_name", node)
    # warm-up runs are in the profile too: the median of each node's last ``runs`` events
    rows = {name: (types[name], statistics.median(v[-runs:])) for name, v in per_node.items()}
    return rows, statistics.median(plain) * 1e3


def class_of(name: str, kind: str) -> str:
    cls = op_class(kind)
    return op_class(name) if cls == "other" else cls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=harness.model_name)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seq", type=int, default=harness.SEQ)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--work-dir", default=None, help="where the ONNX files go")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    work = Path(args.work_dir or tempfile.mkdtemp())
    work.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        model = harness.build(name, args.seq)
        path = bench_peers.onnx_file(model, work)
        engines = {}
        for engine, fn, extra in (("ours", profile_ours, ()), ("openvino", profile_openvino, (path,)),
                                  ("ort", profile_ort, (path,))):
            try:
                engines[engine] = fn(model, *extra, args.threads, args.runs)
            except Exception as exc:  # noqa: BLE001 - a peer that cannot run this model
                print(f"{name}: {engine} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        print(f"\n{name} ({args.threads} threads, medians of {args.runs} runs; ms per inference)")
        print(f"  {'class':10s}" + "".join(f" {e:>10s}" for e in engines))
        totals = {e: collections.Counter() for e in engines}
        for engine, (rows, _) in engines.items():
            for layer, (kind, ms) in rows.items():
                totals[engine][class_of(layer, kind)] += ms
        for cls in CLASSES:
            if any(totals[e][cls] for e in engines):
                print(f"  {cls:10s}" + "".join(f" {totals[e][cls]:10.2f}" for e in engines))
        print(f"  {'sum':10s}" + "".join(f" {sum(totals[e].values()):10.2f}" for e in engines))
        print(f"  {'plain call':10s}" + "".join(f" {plain:10.2f}" for _, plain in engines.values()))
        for engine, (rows, _) in engines.items():
            print(f"\n  {engine}: slowest layers")
            for layer, (kind, ms) in sorted(rows.items(), key=lambda r: -r[1][1])[: args.top]:
                print(f"    {ms:8.3f}  {class_of(layer, kind):9s} {kind[:40]:40s} {layer[:60]}")


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
