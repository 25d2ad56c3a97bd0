"""Attention's tile loop with each head's row tiles in turn against the row tiles outside
the heads, in one process: ``python -m scripts.ab_attention_order [--seq N] [MODEL ...]``.

Sides, each built twice and called in turn (``harness.compare_sides``):
``tile_major`` fuses the parallel tile loop as (row tile, head), as the rule did before
(``CompileOptions.attention_head_major`` False), so a core's consecutive steps read every
head's kᵀ and v in turn; ``head_major``, the default build (``attention._tile_loop``):
(head, row tile), one head's kᵀ and v read by
consecutive steps.  Printed per side: the median time, in brackets the median over rounds
of its time over tile_major's, the error against PyTorch and whether the output has
tile_major's bits.  MODEL: as ``ab_gemm_rules.py``; ``--seq`` sets the text models' length.
"""

from __future__ import annotations

from aicf_tvm import CompileOptions
from scripts.harness import compare_main


def main() -> None:
    sides = {"tile_major": CompileOptions(attention_head_major=False), "head_major": CompileOptions()}
    compare_main(__doc__, sides, ["bert", "vit", "dinov2"], 128)


if __name__ == "__main__":
    main()
