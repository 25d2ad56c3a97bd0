"""One dynamic-shape compile against one compile per shape, and against ONNX Runtime.

Usage::

    python -m scripts.bench_dynamic [--small] [--models bert gpt2 llama] [--shapes 1x16 1x64 ...]
                                    [--repeat 5] [--threads N] [--tol 1e-3]

Each model (a BERT encoder, GPT-2 and LLaMA-style decoders; random weights, seeded; all-ones
attention mask) is compiled once with a dynamic batch and sequence length
(``Dim("batch", max=8)``, ``Dim("seq", max=512)``) and once per static shape, and exported
once to ONNX with dynamic axes (``torch.onnx.export(dynamo=False)``) for ONNX Runtime (CPU
EP, every graph optimization, ``--threads`` intra-op threads, spinning off).  Per (batch,
seq): the latency of each (``timeit``, the minimum over ``--repeat`` repeats: the machine
is shared, the minimum is the least disturbed run), ours-dynamic / ours-static and
ours-dynamic / ORT (and their geometric means over the shapes), and whether every output
matches PyTorch (``max|a-b| / max|ref| <= --tol``; ``MISMATCH`` otherwise).
The three engines are timed in turn on the same inputs, so a noisy neighbour shifts the
ratios less than the absolute numbers.  ``--small`` shrinks the models and the shapes to a
quick check (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from scripts.harness import TextModel, compile_text, interleaved_best, text_model, token_inputs

SHAPES = ((1, 16), (1, 64), (2, 100), (4, 128), (1, 384))
SMALL_SHAPES = ((1, 16), (1, 64), (2, 100))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="small models and shapes (a quick check)")
    parser.add_argument("--models", nargs="+", default=["bert", "gpt2", "llama"], choices=["bert", "gpt2", "llama"])
    parser.add_argument("--shapes", nargs="+", default=None, help="BATCHxSEQ, e.g. 1x16 4x128")
    parser.add_argument("--repeat", type=int, default=5, help="timeit repeats (the minimum is reported)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="ONNX Runtime intra-op threads (ours sizes its own pool to the same CPUs)")
    parser.add_argument("--tol", type=float, default=1e-3, help="max |a-b| / max |ref| allowed")
    args = parser.parse_args()
    if args.shapes is None:
        args.shapes = SMALL_SHAPES if args.small else SHAPES
    else:
        args.shapes = tuple(tuple(int(x) for x in s.split("x")) for s in args.shapes)
    return args


def ort_session(model: TextModel, example: tuple, threads: int, work: Path) -> Any:
    import onnxruntime as ort
    import torch

    path = work / f"{model.name}.onnx"
    axes = {0: "batch", 1: "seq"}
    with torch.no_grad():
        torch.onnx.export(model.module, example, str(path), input_names=["input_ids", "attention_mask"],
                          output_names=["output"], opset_version=17, dynamo=False,
                          dynamic_axes={"input_ids": axes, "attention_mask": axes, "output": axes})
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def mismatch(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def bench(model: TextModel, args: argparse.Namespace, work: Path) -> list[str]:
    import torch

    start = time.perf_counter()
    dynamic = compile_text(model, token_inputs(model, 2, 16, 0), dynamic=True)
    dyn_s = time.perf_counter() - start
    session = ort_session(model, token_inputs(model, 2, 16, 0), args.threads, work)
    rows = [f"{model.name}: dynamic compile {dyn_s:.1f} s, kernels: "
            + ", ".join(sorted({k.schedule for k in dynamic.kernels}))]
    ratios: list[tuple[float, float]] = []
    for batch, seq in args.shapes:
        ids, mask = token_inputs(model, batch, seq, seq)
        with torch.no_grad():
            ref = model.module(ids, mask).numpy()
        static = compile_text(model, (ids, mask), dynamic=False)
        feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
        runs = {
            "dynamic": lambda feeds=feeds: dynamic(feeds["input_ids"], feeds["attention_mask"]),
            "static": lambda static=static, feeds=feeds: static(feeds["input_ids"], feeds["attention_mask"]),
            "ort": lambda feeds=feeds: session.run(None, feeds)[0],
        }
        errors = {name: mismatch(np.asarray(run()), ref) for name, run in runs.items()}
        times = interleaved_best(runs, args.repeat)
        bad = [name for name, err in errors.items() if not err <= args.tol]
        rows.append(
            f"  {batch}x{seq:<4d} dynamic {times['dynamic'] * 1e3:8.2f} ms  static {times['static'] * 1e3:8.2f} ms"
            f"  ORT {times['ort'] * 1e3:8.2f} ms  dyn/static {times['dynamic'] / times['static']:5.2f}"
            f"  dyn/ORT {times['dynamic'] / times['ort']:5.2f}  "
            + ("ok" if not bad else "MISMATCH " + ", ".join(f"{n}={errors[n]:.1e}" for n in bad))
        )
        print(rows[-1], flush=True)
        ratios.append((times["dynamic"] / times["static"], times["dynamic"] / times["ort"]))
    means = [math.exp(sum(math.log(r[k]) for r in ratios) / len(ratios)) for k in (0, 1)]
    rows.append(f"  geometric mean  dyn/static {means[0]:5.2f}  dyn/ORT {means[1]:5.2f}")
    return rows


def main() -> None:
    from aicf_tvm.core.errors import UnsupportedModelError

    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_dynamic_") as tmp:
        table = []
        for name in args.models:
            try:
                rows = bench(text_model(name, args.small), args, Path(tmp))
            except UnsupportedModelError as err:  # the model, not the benchmark: report, go on
                rows = [f"{name}: not compiled: {str(err).splitlines()[0][:200]}"]
            print(rows[0], flush=True)
            table += rows
    print("\n".join(table))


if __name__ == "__main__":
    main()
