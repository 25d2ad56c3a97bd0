"""Pre-packed weights on and off, side by side: ``python -m scripts.bench_prepack [MODELS...]``.

Each model is compiled twice on this machine's CPU: as ``aicf_tvm.compile`` does (constant
GEMM operands packed at compile time) and with the packing left in the kernels (every call
packs B). Both run on the same random inputs, interleaved round by round; the script checks
the outputs agree and prints the median times and their ratio (< 1: pre-packing is faster).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import aicf_tvm
import schedules.prepack_weights as prepack


def compile_both(model: str, target: str):
    mod = aicf_tvm.load_model(model)
    packed = aicf_tvm.compile(mod, target=target)
    mark = prepack.mark_layout_free
    prepack.mark_layout_free = lambda m, func_name="main": m  # no parameter is layout-free
    try:
        per_call = aicf_tvm.compile(mod, target=target)
    finally:
        prepack.mark_layout_free = mark
    return packed, per_call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["encoder_layer", "decoder_block"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--target", default="llvm")
    args = parser.parse_args()
    print(f"{'model':16s} {'prepacked':>12s} {'per-call pack':>14s} {'ratio':>7s}  packed weights")
    for model in args.models:
        packed, per_call = compile_both(model, args.target)
        rng = np.random.default_rng(0)
        inputs = [rng.standard_normal([int(d) for d in s.shape]).astype(s.dtype) for s in packed.inputs]
        got, want = packed(*inputs), per_call(*inputs)
        for g, w in zip(got if isinstance(got, list) else [got], want if isinstance(want, list) else [want]):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        times: dict[str, list[float]] = {"packed": [], "per_call": []}
        for _ in range(args.rounds):
            for name, model_fn in (("packed", packed), ("per_call", per_call)):
                start = time.perf_counter()
                model_fn(*inputs)
                times[name].append(time.perf_counter() - start)
        a, b = (float(np.median(times[k])) for k in ("packed", "per_call"))
        n = sum(1 for d in packed.report.decisions if d.candidate == "materialize:layout_transform")
        print(f"{model:16s} {a * 1e3:10.2f} ms {b * 1e3:12.2f} ms {a / b:7.3f}  {n}")


if __name__ == "__main__":
    main()
