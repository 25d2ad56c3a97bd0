"""Attention in one pass over tiles, with kᵀ packed in panels, against the two passes
over a row-major kᵀ, in one process: ``python -m scripts.ab_attention_tiles [--seq N] [MODEL ...]``.

Sides, each built twice and called in turn (``harness.compare_sides``): ``two_pass``
packs kᵀ ``[b, k, keys]`` and runs q·kᵀ for every row before the softmax and p·v
(``attention._one_pass`` and ``attention._key_panels`` switched off:
``CompileOptions.attention_one_pass`` False), as the rule did before; ``one_pass``, the
default build: q·kᵀ inside the tile loop of the softmax and p·v
where the key count is whole register tiles, kᵀ in panels of a tile's keys.  Printed per
side: the median time, in brackets the median over rounds of its time over two_pass's,
the error against PyTorch and whether the output has two_pass's bits.  MODEL: as
``ab_gemm_rules.py``; ``--seq`` sets the text models' length (the attention's share grows
with it: at 128 tokens it is a few percent of the model, at 1024 a third of GPT-2's).
"""

from __future__ import annotations

from aicf_tvm import CompileOptions
from scripts.harness import compare_main


def main() -> None:
    sides = {"two_pass": CompileOptions(attention_one_pass=False), "one_pass": CompileOptions()}
    compare_main(__doc__, sides, ["bert", "gpt2", "llama"], 512)


if __name__ == "__main__":
    main()
