"""Attention's tile loop with each head's row tiles in turn against the row tiles outside
the heads, in one process: ``python -m scripts.ab_attention_order [--seq N] [MODEL ...]``.

Sides, each built twice and called in turn (``ab_gemm_rules.compare_sides``):
``tile_major`` fuses the parallel tile loop as (row tile, head), as the rule did before,
so a core's consecutive steps read every head's kᵀ and v in turn; ``head_major``, the
default build (``attention._tile_loop``): (head, row tile), one head's kᵀ and v read by
consecutive steps.  Printed per side: the median time, in brackets the median over rounds
of its time over tile_major's, the error against PyTorch and whether the output has
tile_major's bits.  MODEL: as ``ab_gemm_rules.py``; ``--seq`` sets the text models' length.
"""

from __future__ import annotations


from scripts.ab_gemm_rules import compare_main

from schedules.cpu import attention  # noqa: E402

HEAD_MAJOR = attention._tile_loop


def tile_major(sch, block, rows):
    *batch, i, j, k = sch.get_loops(block)
    outer, inner = sch.split(i, [None, rows])
    sch.reorder(outer, *batch, inner, j, k)
    return sch.fuse(outer, *batch)


def use(rule) -> None:
    attention._tile_loop = rule


def main() -> None:
    sides = {"tile_major": lambda: use(tile_major), "head_major": lambda: use(HEAD_MAJOR)}
    compare_main(__doc__, sides, lambda: use(HEAD_MAJOR), ["bert", "vit", "dinov2"], 128)


if __name__ == "__main__":
    main()
