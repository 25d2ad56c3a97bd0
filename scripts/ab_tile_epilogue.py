"""The GEMM epilogue on each register tile against a pass over each parallel chunk, in one
process: ``python -m scripts.ab_tile_epilogue [--seq N] [MODEL ...]``.

Sides, each built twice and called in turn (``harness.compare_sides``): ``chunk`` zeroes
a parallel chunk's block of C before its K loops and runs the epilogue (bias, activation,
residual) over the block after them (``CompileOptions.gemm_tile_epilogue`` False), as the
rule did before; ``tile``, the default build: where K is one block, each register tile's
sums start from zero in registers and the epilogue runs on the tile as soon as its K loop
ends (``gemm._tile_loop``).  Printed per side: the median time, in brackets the median
over rounds of its time over chunk's, the error against PyTorch and whether the output has
chunk's bits.
"""

from __future__ import annotations

from aicf_tvm import CompileOptions
from scripts.harness import compare_main


def main() -> None:
    sides = {"chunk": CompileOptions(gemm_tile_epilogue=False), "tile": CompileOptions()}
    compare_main(__doc__, sides, ["bert", "gpt2", "llama", "vit", "whisper", "swin", "distilbert", "qwen2",
                                  "mobilenetv2"], 128)


if __name__ == "__main__":
    main()
