"""Uniform constant operands as scalars against keeping them whole, in one process:
``python -m scripts.ab_uniform_constants [MODEL ...]``.

"new" is the default build: ``ImplicitBroadcasts`` gives a pointwise op the one element
of a constant operand whose elements all have the same bits (SDPA's zero mask and the
zeros its all-masked-row guard fills from).  "old" keeps such operands whole, as before,
inside the same process.  Each side is built twice and their calls interleaved
(``ab_gemm_rules.compare_sides``: the ratio, the error against PyTorch and whether the
bits equal old's, per model).

MODEL: any model ``ab_gemm_rules.make`` builds.
"""

from __future__ import annotations


from scripts.ab_gemm_rules import patched_main

from relax_passes import implicit_broadcasts

if __name__ == "__main__":
    patched_main(__doc__, implicit_broadcasts, "uniform_constant", lambda value: None,
                 ["vit", "bert", "gpt2", "llama"])
