"""The blocked convolution's register tile against its earlier forms, in one process:
``python -m scripts.ab_conv_tiles [MODEL ...]``.

"held" is the default build.  Inside the same process, "dividing" restores the AVX-512
tile whose columns always divide the output width (``conv2d_blocked.register_tile``
before partial tiles: a width with no divisor near the widest tile, 19, 38, 199 or 799,
then ran one or two columns per step), and "partial" the first form of partial tiles,
which took the tile of the most FMAs per step (2 x 14: 28 accumulators) where "held" takes
the best of at most half the registers (1 x 14).  Each side is built twice and their calls
interleaved (``ab_gemm_rules.compare_sides``: the ratio to "dividing", the error against
PyTorch and whether the bits equal its, per model).

MODEL: any model ``ab_gemm_rules.make`` builds, ``NAME@SIZE`` a convnet at SIZE px
(``resnet50@299``: ResNet-50 at 299 px, whose stages are 150, 75, 38, 19 and 10 wide).
"""

from __future__ import annotations


from scripts.ab_gemm_rules import compare_main

from schedules.cpu import conv2d_blocked

HELD = conv2d_blocked.register_tile


def dividing_tile(blocks: int, width: int, vectors_per_block: int, registers: int = 32) -> tuple[int, int]:
    """The tile before partial tiles on AVX-512: the best whose columns divide the width."""
    dividing, _ = conv2d_blocked.tile_candidates(blocks, width, vectors_per_block, registers)
    return conv2d_blocked.best_tile(dividing) if dividing else (1, 1)


def partial_tile(blocks: int, width: int, vectors_per_block: int, registers: int = 32) -> tuple[int, int]:
    """The first partial tiles: the best partial tile, however many accumulators it holds."""
    dividing, partial = conv2d_blocked.tile_candidates(blocks, width, vectors_per_block, registers)
    if not dividing:
        return 1, 1
    tile, wide = conv2d_blocked.best_tile(dividing), conv2d_blocked.best_tile(partial)
    return wide if registers >= 32 and 2 * tile[0] * tile[1] < wide[0] * wide[1] else tile


def use(tile) -> None:
    conv2d_blocked.register_tile = tile


if __name__ == "__main__":
    compare_main(__doc__, {"dividing": lambda: use(dividing_tile), "partial": lambda: use(partial_tile),
                           "held": lambda: use(HELD)}, lambda: use(HELD),
                 ["resnet50@299", "wav2vec2", "whisper", "regnet@299", "efficientnet@260"], 128)
