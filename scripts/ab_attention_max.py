"""The attention row max over vector lanes at key counts that are not whole vectors,
against the serial max, in one process: ``python -m scripts.ab_attention_max [MODEL ...]``.

Sides, each built twice and called in turn (``harness.compare_sides``): ``serial``
without ``whole_vectors.pad_max`` (``CompileOptions.attention_lane_max`` False: a static
key count that is not a multiple of the lanes
then takes its row max in a scalar loop, as before the padding covered constant counts);
``lanes``, the default build.  Printed per side: the median time, in brackets the median
over rounds of its time over serial's, the error against PyTorch and whether the output
has serial's bits.  MODEL: as ``ab_gemm_rules.py``; the default models have 196 (SigLIP),
197 (ViT, DeiT, BEiT) and 257 (DINOv2) tokens.
"""

from __future__ import annotations

import argparse

from aicf_tvm import CompileOptions
from scripts.harness import compare_sides


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=["vit", "siglip", "dinov2", "deit", "beit"])
    args = parser.parse_args()
    sides = {"serial": CompileOptions(attention_lane_max=False), "lanes": CompileOptions()}
    for name in args.models:
        print(compare_sides(name, sides), flush=True)


if __name__ == "__main__":
    main()
