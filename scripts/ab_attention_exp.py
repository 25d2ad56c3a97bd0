"""The softmax's exp over two vectors of keys per step against one, in one process:
``python -m scripts.ab_attention_exp [--seq N] [MODEL ...]``.

Sides, each built twice and called in turn (``harness.compare_sides``): ``one``, the exp
loop of the attention kernel one vector of keys per step (``CompileOptions.
attention_exp_vectors=1``), as before; ``two``, the default build: two vectors per step,
whose exp chains interleave (``attention._schedule_row_block``).  Printed per side: the
median time, in brackets the median over rounds of its time over one's, the error against
PyTorch and whether the output has one's bits.  ``--seq`` sets the text models' length
(the attention's share grows with it).
"""

from __future__ import annotations

from aicf_tvm import CompileOptions
from scripts.harness import compare_main


def main() -> None:
    sides = {"one": CompileOptions(attention_exp_vectors=1), "two": CompileOptions()}
    compare_main(__doc__, sides, ["whisper", "bert", "gpt2", "llama", "vit"], 512)


if __name__ == "__main__":
    main()
