"""AVX2's attention register tiles of 6 rows against the 4 rows of the rule before, in one
process: ``python -m scripts.ab_attention_full_tile [--seq N] [MODEL ...]``.

Sides, each built twice and called in turn (``harness.compare_sides``): ``half``, the
accumulators of q·kᵀ's and p·v's register tiles within half the 16 registers (4 rows x 2
vectors; ``CompileOptions.attention_full_register_tile`` False), as before; ``full``, the
default build: 6 rows x 2 vectors, 12 accumulators beside the 2 loaded vectors and the
broadcast (``attention_analysis.plan_attention``).  On a target with 32 vector registers
(AVX-512) both sides compile alike.  Printed per side: the median time, in brackets the
median over rounds of its time over half's, the error against PyTorch and whether the
output has half's bits.
"""

from __future__ import annotations

from aicf_tvm import CompileOptions
from scripts.harness import compare_main


def main() -> None:
    sides = {"half": CompileOptions(attention_full_register_tile=False), "full": CompileOptions()}
    compare_main(__doc__, sides, ["whisper", "bert", "gpt2", "vit", "swin", "llama"], 128)


if __name__ == "__main__":
    main()
