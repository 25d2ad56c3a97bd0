"""A/B: GEMMs summing each K block from zero (the default) against one serial sum over K.

Usage: ``python -m scripts.ab_blocked_sums [MODEL ...] [--seq N]`` ("old": one running
sum through K, ``blocked_sums=False``; "new": the default build).  The outputs
differ in bits; the error against PyTorch is printed beside the times
(schedules/cpu/gemm_prefetch.py, docs/numerics.md).
"""

from __future__ import annotations

from scripts.harness import old_new_main

if __name__ == "__main__":
    from aicf_tvm import CompileOptions

    old_new_main(__doc__, CompileOptions(blocked_sums=False),
                 ["bert", "vit", "resnet50", "mobilenetv2", "convnext", "efficientnet", "regnet"])
