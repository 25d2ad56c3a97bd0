"""Combined projections and even column blocks against their absence, in one process:
``python -m scripts.ab_projections [MODEL ...]``.

Sides, each built twice and called in turn (``harness.compare_sides``): ``base``
without ``relax_passes.CombineProjections`` and with the widest column block of at most
512 (``gemm_plan._choose_nc`` before it split the blocks evenly over the cores:
``CompileOptions.combine_projections`` and ``gemm_even_column_blocks`` False);
``even`` with the even split alone; ``both``, the default build.  Printed per side: the
median time, in brackets the median over rounds of its time over base's, the error
against PyTorch and whether the output has base's bits.  MODEL: as ``ab_gemm_rules.py``.
"""

from __future__ import annotations

import argparse

from aicf_tvm import CompileOptions
from scripts.harness import compare_sides


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=["llama", "vit", "bert", "gpt2"])
    args = parser.parse_args()
    sides = {"base": CompileOptions(combine_projections=False, gemm_even_column_blocks=False),
             "even": CompileOptions(combine_projections=False), "both": CompileOptions()}
    for name in args.models:
        print(compare_sides(name, sides), flush=True)


if __name__ == "__main__":
    main()
