"""AVX2's GEMM register tile filling the 16 registers against the rule's earlier tile, in
one process: ``python -m scripts.ab_full_register_tile [--seq N] [MODEL ...]``.

Sides, each built twice and called in turn (``harness.compare_sides``): ``rule`` takes the
widest ``nr`` that pads N least, then the rows that pad M least
(``CompileOptions.gemm_full_register_tile`` False), as before; ``full``, the default
build: a GEMM with several K blocks takes, of 4 rows x 3 vectors and 6 x 2 (12
accumulators each, with the B vectors and the broadcast all 16 registers), the one with
the most accumulators, then the least padding (``gemm_plan._full_register_tile``).  On a
target with 32 vector registers (AVX-512) both sides compile alike.  Printed per side: the
median time, in brackets the median over rounds of its time over rule's, the error against
PyTorch and whether the output has rule's bits.
"""

from __future__ import annotations

from aicf_tvm import CompileOptions
from scripts.harness import compare_main


def main() -> None:
    sides = {"rule": CompileOptions(gemm_full_register_tile=False), "full": CompileOptions()}
    compare_main(__doc__, sides, ["bert", "gpt2", "llama", "vit", "whisper", "swin", "distilbert", "qwen2"], 128)


if __name__ == "__main__":
    main()
