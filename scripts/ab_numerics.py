"""A/B: the ``exact`` numeric level against ``relaxed`` (docs/numerics.md), model by model.

Usage: ``python -m scripts.ab_numerics [MODEL ...] [--seq N]``: each model built with both
levels in one process, their calls interleaved (``harness.compare_sides``): time over the
exact build's and error against PyTorch float32, side by side.
"""

from __future__ import annotations

from scripts.harness import compare_main

if __name__ == "__main__":
    from aicf_tvm import CompileOptions

    compare_main(__doc__, {"exact": CompileOptions(numerics="exact"), "relaxed": CompileOptions(numerics="relaxed")},
                 ["whisper", "bert", "gpt2", "llama", "vit", "swin"], 128)
