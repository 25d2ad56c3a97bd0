"""Attention's v packed in slices of p·v's register tile against v read in place, in one
process: ``python -m scripts.ab_pack_v [--seq N] [MODEL ...]``.

Sides, each built twice and called in turn (``harness.compare_sides``): ``in_place``
reads v where the graph has it (for a model, rows of every head of the projection's
output: ``CompileOptions.attention_pack_v`` False), as the rule did before; ``packed``,
the default build: v copied once per call into ``[b, d / width, keys, width]``, each
slice's keys contiguous (``attention._pack_v``), where a head has several row tiles.
Printed per side: the median time, in brackets the median over rounds of its time over
in_place's, the error against PyTorch and whether the output has in_place's bits.
"""

from __future__ import annotations

from aicf_tvm import CompileOptions
from scripts.harness import compare_main


def main() -> None:
    sides = {"in_place": CompileOptions(attention_pack_v=False), "packed": CompileOptions()}
    compare_main(__doc__, sides, ["whisper", "bert", "vit", "gpt2", "swin", "llama"], 128)


if __name__ == "__main__":
    main()
