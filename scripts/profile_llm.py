"""Where a compiled LLM's prefill and decode step spend their time, kernel by kernel:
TVM's VM profiler over one prefill of ``--prompt`` tokens and one decode step after it,
on ``scripts.bench_llm``'s model (``--folder``, the same random-weight 110M LLaMA).

    python -m scripts.profile_llm [--weights fp32|int8|int4] [--activations auto|float32|int8] [--prompt 128] [--top 25]

Printed per function: its kernels by time per call of the function (ms, share, calls;
the VM's own calls such as reshapes and allocations included). Timing each call adds a
little; compare shares, not the totals with ``bench_llm``'s.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np


def profile(lm, name: str, args: list, runs: int = 5) -> list[tuple[str, float, int]]:
    """(kernel, ms per call of ``name``, calls) over ``runs`` calls of the VM function
    ``name`` after a warm one: a VM instrument times each kernel call (the
    ``tuning.in_models.kernel_seconds`` way)."""
    import time

    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    start = [0.0]

    def instrument(func, symbol: str, before: bool, ret, *_args) -> int:
        if before:
            start[0] = time.perf_counter()
        else:
            entry = totals[symbol]
            entry[0] += (time.perf_counter() - start[0]) * 1e3 / runs
            entry[1] += 1 / runs
        return 0

    vm = lm.model.vm
    args = [*args, *lm.model.weights_args]
    vm[name](*args)  # warm
    vm.set_instrument(instrument)
    try:
        for _ in range(runs):
            vm[name](*args)
    finally:
        vm.set_instrument(None)
    return sorted(((k, v[0], round(v[1])) for k, v in totals.items()), key=lambda t: -t[1])


def main() -> None:
    import tvm

    import aicf_tvm
    from aicf_tvm.runtime.llm import DECODE
    from scripts.bench_llm import DEFAULT_FOLDER, make_folder

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=DEFAULT_FOLDER)
    parser.add_argument("--weights", choices=["fp32", "int8", "int4"], default="fp32")
    parser.add_argument("--activations", choices=["auto", "float32", "int8"], default="auto")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()

    make_folder(args.folder)
    lm = aicf_tvm.compile_causal_lm(str(args.folder), max_length=args.prompt + 8, weights=args.weights,
                                    activations=args.activations)
    ids = np.random.default_rng(0).integers(3, lm.config.vocab_size, (1, args.prompt))
    lm.prefill(ids)  # caches allocated, one step taken
    dev = lm.model.device
    caches = lm._caches[0]
    ones = tvm.runtime.tensor(np.ones((1, args.prompt + 1), np.int64), dev)
    for name, step_ids, mask in (("main", ids, ones._create_view((1, args.prompt))),
                                 (DECODE, ids[:, :1], ones)):
        rows = profile(lm, name, [tvm.runtime.tensor(step_ids, dev), mask, *caches])
        total = sum(r[1] for r in rows)
        print(f"\n{name} ({args.weights}, activations {lm.config.activations}, prompt {args.prompt}): "
              f"{total:.2f} ms in {len(rows)} functions")
        for kernel, ms, calls in rows[:args.top]:
            print(f"  {ms:8.3f} ms {ms / total:6.1%} {calls:4d}x  {kernel}")


if __name__ == "__main__":
    main()
