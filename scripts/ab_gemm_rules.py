"""The GEMM rules of Intel AVX-512 cores against their earlier form, in one process:
``python -m scripts.ab_gemm_rules [MODEL ...]``.

"new" is the default build.  "old" switches off, inside the same process, the three
rules that followed the by-area tile (``CompileOptions``): the B panel prefetch
(``gemm_prefetch_b_panels``), the padding slack of the by-area tile (``gemm_area_slack``
1.0: least padding first) and ``kc`` near 128 (``gemm_kc_near_by_area`` 256).  Each side is built
twice; the builds' calls alternate (``harness.compare_sides``: 24 pairs, the order flipped every pair) and the
printed ratio (in brackets, with the error and whether the bits equal old's) is the
median of new/old over the pairs.  Both outputs are checked against
PyTorch (the error relative to the output's largest magnitude) after checking that two
different inputs give different outputs.

MODEL: a model of ``harness.ab_model``: one of ``scripts/bench_peers.py`` (bert, gpt2, llama,
vit, resnet50, ...) or ``distilbert`` or ``qwen2`` (a 3-layer Qwen2-style decoder: hidden 896, 14 heads, 2
key/value heads, sequence 96), which no issue names.  On other CPUs the rules may not
apply (``common.gemm_tiles_by_area``); the two sides then compile alike.
"""

from __future__ import annotations

import argparse

from aicf_tvm import CompileOptions
from schedules.cpu import gemm_plan
from scripts.harness import compare_sides

NEW = CompileOptions()
OLD = CompileOptions(gemm_area_slack=1.0, gemm_kc_near_by_area=gemm_plan.KC_NEAR, gemm_prefetch_b_panels=False)


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
