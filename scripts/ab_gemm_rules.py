"""The GEMM rules of Intel AVX-512 cores against their earlier form, in one process:
``python -m scripts.ab_gemm_rules [MODEL ...]``.

"new" is the default build.  "old" switches off, inside the same process, the three
rules that followed the by-area tile (``CompileOptions``): the B panel prefetch
(``gemm_prefetch_b_panels``), the padding slack of the by-area tile (``gemm_area_slack``
1.0: least padding first) and ``kc`` near 128 (``gemm_kc_near_by_area`` 256).  Each side is built
twice; the builds' calls alternate (24 pairs, the order flipped every pair) and the
printed ratio (in brackets, with the error and whether the bits equal old's) is the
median of new/old over the pairs.  Both outputs are checked against
PyTorch (the error relative to the output's largest magnitude) after checking that two
different inputs give different outputs.

MODEL: a model of ``scripts/bench_peers.py`` (``harness.ab_model``) (bert, gpt2, llama, vit, resnet50, ...) or
``distilbert`` or ``qwen2`` (a 3-layer Qwen2-style decoder: hidden 896, 14 heads, 2
key/value heads, sequence 96), which no issue names.  On other CPUs the rules may not
apply (``common.gemm_tiles_by_area``); the two sides then compile alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import aicf_tvm
from aicf_tvm import CompileOptions
from schedules.cpu import gemm_plan
from scripts.harness import ab_model

BUILDS, PAIRS = 2, 24
NEW = CompileOptions()
OLD = CompileOptions(gemm_area_slack=1.0, gemm_kc_near_by_area=gemm_plan.KC_NEAR, gemm_prefetch_b_panels=False)


def compare_sides(name: str, sides: dict[str, CompileOptions], seq: int = 128) -> str:
    """``name`` built ``BUILDS`` times with each side's options (the first side is the
    base), the builds' calls interleaved for ``PAIRS`` rounds (the order reversed every
    other round); per side its median time, the median over rounds of its time over the
    base's, its error against PyTorch and whether its output has the base's bits.
    ``seq``: the sequence length of a text model (``bench_peers.build``)."""
    import torch

    model = ab_model(name, seq)
    mod = aicf_tvm.from_torch(model.module, model.inputs)
    inputs = [t.numpy() for t in model.inputs]
    with torch.no_grad():
        want = model.module(*model.inputs).numpy()
        other = model.module(*model.other_inputs).numpy()
    if np.array_equal(want, other):
        raise SystemExit(f"{name}: two different inputs give the same output; no check possible")
    builds = {label: [aicf_tvm.compile(mod, target="llvm", options=options) for _ in range(BUILDS)]
              for label, options in sides.items()}
    outputs = {label: np.asarray(compiled[0](*inputs)) for label, compiled in builds.items()}
    for compiled in (c for side in builds.values() for c in side):
        compiled(*inputs)  # every build called once before the timed rounds
    base = next(iter(sides))
    scale = float(np.abs(want).max())
    times: dict[str, list[float]] = {label: [] for label in sides}
    for turn in range(PAIRS):
        for label in list(sides) if turn % 2 == 0 else list(sides)[::-1]:
            compiled = builds[label][turn % BUILDS]
            start = time.perf_counter()
            compiled(*inputs)
            times[label].append(time.perf_counter() - start)
    parts = [f"{name:12s}"]
    for label in sides:
        ratio = statistics.median(t / b for t, b in zip(times[label], times[base]))
        error = float(np.abs(outputs[label] - want).max()) / scale
        same = "same bits" if np.array_equal(outputs[label], outputs[base]) else "other bits"
        median = 1e3 * statistics.median(times[label])
        parts.append(f"{label} {median:.2f} ms ({ratio:.3f}, {error:.1e}, {same})")
    return "  ".join(parts)


def compare_main(doc: str, sides: dict[str, CompileOptions], models: list[str], seq: int) -> None:
    """A comparison script's main: MODEL ... and ``--seq`` from the command line, each
    model's sides compared by ``compare_sides``, one line per model."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=models)
    parser.add_argument("--seq", type=int, default=seq, help="the text models' length")
    args = parser.parse_args()
    for name in args.models:
        print(f"seq {args.seq:<5d} {compare_sides(name, sides, seq=args.seq)}", flush=True)


def old_new_main(doc: str, old: CompileOptions, models: list[str], seq: int = 128) -> None:
    """``compare_main`` of two sides: "old" built with the options ``old``, "new" with the
    default ones (the default build)."""
    compare_main(doc, {"old": old, "new": CompileOptions()}, models, seq)


def compare(name: str) -> str:
    return compare_sides(name, {"old": OLD, "new": NEW})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=["bert", "gpt2", "llama", "vit", "distilbert", "qwen2"])
    args = parser.parse_args()
    for name in args.models:
        print(compare(name), flush=True)


if __name__ == "__main__":
    main()
