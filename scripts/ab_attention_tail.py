"""Attention at a constant key count of no whole register tiles in one pass against two,
in one process: ``python -m scripts.ab_attention_tail [--seq N] [MODEL ...]``.

Sides, each built twice and called in turn (``harness.compare_sides``): ``two``, such key
counts in two passes (``CompileOptions.attention_one_pass_tail=False``), as before;
``one``, the default build: q·kᵀ in the softmax's tile loop, its keys cut into whole
tiles, whole vectors and a tail (``attention._schedule_qk``). Printed per side: the
median time, in brackets the median over rounds of its time over two's, the error
against PyTorch and whether the output has two's bits. Whisper (1500 frames), ViT (197
tokens), Swin (49-token windows), DeiT (198) and BERT at ``--seq`` (default 100).
"""

from __future__ import annotations

from aicf_tvm import CompileOptions
from scripts.harness import compare_main


def main() -> None:
    sides = {"two": CompileOptions(attention_one_pass_tail=False), "one": CompileOptions()}
    compare_main(__doc__, sides, ["whisper", "vit", "swin", "deit", "bert"], 100)


if __name__ == "__main__":
    main()
