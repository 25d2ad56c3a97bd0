"""Combined projections and even column blocks against their absence, in one process:
``python -m scripts.ab_projections [MODEL ...]``.

Sides, each built twice and called in turn (``ab_gemm_rules.compare_sides``): ``base``
without ``relax_passes.CombineProjections`` and with the widest column block of at most
512 (``gemm_plan._choose_nc`` before it split the blocks evenly over the cores);
``even`` with the even split alone; ``both``, the default build.  Printed per side: the
median time, in brackets the median over rounds of its time over base's, the error
against PyTorch and whether the output has base's bits.  MODEL: as ``ab_gemm_rules.py``.
"""

from __future__ import annotations

import argparse

import tvm

from scripts.ab_gemm_rules import compare_sides

from aicf_tvm.driver import pipeline  # noqa: E402
from schedules.cpu import gemm_plan  # noqa: E402

COMBINE, EVEN = pipeline.CombineProjections, gemm_plan._choose_nc


def widest_nc(n_padded: int, nr: int, batch: int, cores: int) -> int:
    """The column block before the even split: the widest, narrowed only below one chunk a core."""
    nc = gemm_plan._largest_divisor_multiple(n_padded, nr, gemm_plan.NC_MAX)
    if batch * (n_padded // nc) < cores:
        nc = gemm_plan._largest_divisor_multiple(n_padded, nr, max(nr, n_padded // cores))
    return nc


def use(combine: bool, even: bool) -> None:
    pipeline.CombineProjections = COMBINE if combine else (lambda: tvm.transform.Sequential([]))
    gemm_plan._choose_nc = EVEN if even else widest_nc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=["llama", "vit", "bert", "gpt2"])
    args = parser.parse_args()
    sides = {"base": lambda: use(False, False), "even": lambda: use(False, True),
             "both": lambda: use(True, True)}
    for name in args.models:
        print(compare_sides(name, sides, lambda: use(True, True)), flush=True)


if __name__ == "__main__":
    main()
