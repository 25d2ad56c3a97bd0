"""The blocked convolution's register tile against its earlier forms, in one process:
``python -m scripts.ab_conv_tiles [MODEL ...]``.

"held" is the default build.  Inside the same process, "dividing" restores the AVX-512
tile whose columns always divide the output width (``conv2d_blocked.register_tile``
before partial tiles: a width with no divisor near the widest tile, 19, 38, 199 or 799,
then ran one or two columns per step), and "partial" the first form of partial tiles
(``CompileOptions.conv_register_tile``),
which took the tile of the most FMAs per step (2 x 14: 28 accumulators) where "held" takes
the best of at most half the registers (1 x 14).  Each side is built twice and their calls
interleaved (``harness.compare_sides``: the ratio to "dividing", the error against
PyTorch and whether the bits equal its, per model).

MODEL: any model ``harness.ab_model`` builds, ``NAME@SIZE`` a convnet at SIZE px
(``resnet50@299``: ResNet-50 at 299 px, whose stages are 150, 75, 38, 19 and 10 wide).
"""

from __future__ import annotations

from aicf_tvm import CompileOptions
from scripts.harness import compare_main

if __name__ == "__main__":
    compare_main(__doc__, {form: CompileOptions(conv_register_tile=form) for form in ("dividing", "partial", "held")},
                 ["resnet50@299", "wav2vec2", "whisper", "regnet@299", "efficientnet@260"], 128)
