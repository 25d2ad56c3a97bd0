"""Sealed float arithmetic against TVM's real-number algebra and contraction, in one
process: ``python -m scripts.ab_ieee_arith [MODEL ...]``.

"new" is the default build: ``schedules.cpu.ieee_arith.IEEEArithmetic`` keeps every float
``+ - * /`` of a kernel from the TIR simplifier and from FMA contraction, except a dot
product's multiply-accumulate.  "old" skips it (``CompileOptions.ieee_arithmetic``
False), as before, inside the same process.  Each
side is built twice and their calls interleaved (``harness.compare_sides``: the
ratio, the error against PyTorch and whether the bits equal old's, per model).

MODEL: any model ``harness.ab_model`` builds.
"""

from __future__ import annotations

from aicf_tvm import CompileOptions
from scripts.harness import old_new_main

if __name__ == "__main__":
    old_new_main(__doc__, CompileOptions(ieee_arithmetic=False),
                 ["bert", "gpt2", "llama", "vit", "resnet50", "mobilenetv2"])
