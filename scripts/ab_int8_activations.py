"""int4 (or int8) weights with float32 against int8 activations, in one process: ``python -m
scripts.ab_int8_activations [--weights int4|int8] [--folder DIR] [--rounds N]``.

Compiles ``bench_llm``'s 110M LLaMA-style model (its folder, made there if missing) with
``weights`` twice, ``activations="float32"`` and ``"int8"``, then generates 64
tokens after a 128-token prompt with each in turn, ``--rounds`` times, and prints each
side's median prefill time and decode rate, and the share of the greedy tokens the two
sides agree on.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np


def main() -> None:
    from scripts.bench_llm import CONFIG, DEFAULT_FOLDER, make_folder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=DEFAULT_FOLDER)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--weights", choices=("int4", "int8"), default="int4")
    args = parser.parse_args()

    import aicf_tvm

    make_folder(args.folder)
    prompt = np.random.default_rng(0).integers(3, CONFIG["vocab_size"], (1, 128))
    lms = {act: aicf_tvm.compile_causal_lm(str(args.folder), max_length=192, weights=args.weights,
                                           activations=act)
           for act in ("float32", "int8")}
    rows: dict[str, dict[str, list]] = {act: {"prefill": [], "decode": []} for act in lms}
    tokens = {}
    for _ in range(args.rounds):
        for act, lm in lms.items():
            tokens[act] = lm.generate(prompt, max_new_tokens=64, stop_tokens=[])[0, 128:]
            rows[act]["prefill"].append(lm.last_timings["prefill_ms"])
            rows[act]["decode"].append(lm.last_timings["decode_tokens_per_s"])
    for act, r in rows.items():
        print(f"activations {act:8} prefill {statistics.median(r['prefill']):7.1f} ms  "
              f"decode {statistics.median(r['decode']):7.1f} tokens/s")
    print(f"greedy tokens in common: {float(np.mean(tokens['float32'] == tokens['int8'])):.0%}")


if __name__ == "__main__":
    main()
