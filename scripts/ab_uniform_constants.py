"""Uniform constant operands as scalars against keeping them whole, in one process:
``python -m scripts.ab_uniform_constants [MODEL ...]``.

"new" is the default build: ``ImplicitBroadcasts`` gives a pointwise op the one element
of a constant operand whose elements all have the same bits (SDPA's zero mask and the
zeros its all-masked-row guard fills from).  "old" keeps such operands whole
(``CompileOptions.uniform_constants_as_scalars`` False), as before,
inside the same process.  Each side is built twice and their calls interleaved
(``harness.compare_sides``: the ratio, the error against PyTorch and whether the
bits equal old's, per model).

MODEL: any model ``harness.ab_model`` builds.
"""

from __future__ import annotations

from aicf_tvm import CompileOptions
from scripts.harness import old_new_main

if __name__ == "__main__":
    old_new_main(__doc__, CompileOptions(uniform_constants_as_scalars=False), ["vit", "bert", "gpt2", "llama"])
