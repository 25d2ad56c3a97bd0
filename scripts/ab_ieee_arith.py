"""Sealed float arithmetic against TVM's real-number algebra and contraction, in one
process: ``python -m scripts.ab_ieee_arith [MODEL ...]``.

"new" is the default build: ``schedules.cpu.ieee_arith.IEEEArithmetic`` keeps every float
``+ - * /`` of a kernel from the TIR simplifier and from FMA contraction, except a dot
product's multiply-accumulate.  "old" skips it, as before, inside the same process.  Each
side is built twice and their calls interleaved (``ab_gemm_rules.compare_sides``: the
ratio, the error against PyTorch and whether the bits equal old's, per model).

MODEL: any model ``ab_gemm_rules.make`` builds.
"""

from __future__ import annotations


from scripts.ab_gemm_rules import patched_main

from schedules.cpu import ieee_arith

if __name__ == "__main__":
    patched_main(__doc__, ieee_arith, "ieee_arithmetic", lambda func: func,
                 ["bert", "gpt2", "llama", "vit", "resnet50", "mobilenetv2"])
