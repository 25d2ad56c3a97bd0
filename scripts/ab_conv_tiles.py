"""The blocked convolution's register tile against its earlier form, in one process:
``python scripts/ab_conv_tiles.py [MODEL ...]``.

"new" is the default build.  "old" restores, inside the same process, the AVX-512 tile
whose columns always divide the output width (``conv2d_blocked.register_tile`` before
partial tiles): a width with no divisor near the widest tile (19, 38, 199, 799) then ran
one or two columns per step.  Each side is built twice and their calls interleaved
(``ab_gemm_rules.compare_sides``: the ratio, the error against PyTorch and whether the bits
equal old's, per model).

MODEL: any model ``ab_gemm_rules.make`` builds, ``NAME@SIZE`` a convnet at SIZE px
(``resnet50@299``: ResNet-50 at 299 px, whose stages are 150, 75, 38, 19 and 10 wide).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab_gemm_rules import patched_main

from schedules.cpu import conv2d_blocked


def dividing_tile(blocks: int, width: int, vectors_per_block: int, registers: int = 32) -> tuple[int, int]:
    """The tile before partial tiles on AVX-512: the best whose columns divide the width."""
    dividing, _ = conv2d_blocked.tile_candidates(blocks, width, vectors_per_block, registers)
    return conv2d_blocked.best_tile(dividing) if dividing else (1, 1)


if __name__ == "__main__":
    patched_main(__doc__, conv2d_blocked, "register_tile", dividing_tile,
                 ["resnet50@299", "efficientnet@260", "convnext@288", "resnet50"])
