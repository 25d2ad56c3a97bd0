"""Static reshapes legalized group by group against TOPI's kernel, in one process:
``python -m scripts.ab_static_reshapes [MODEL ...]``.

"new" is the default build: ``legalize_reshape`` indexes every reshape whose axes fall
into groups of equal extent products group by group, static shapes included.  "old"
restores, inside the same process, TOPI's kernel for static shapes
(``CompileOptions.static_reshapes_by_group`` False,
``legalize_reshape.legalize_reshape_flat_when_static``), whose flattened index
a fused kernel keeps half simplified (GPT-2's ``[128, 3072] -> [1, 128, 3072]`` read the
GEMM's result at ``(j // 3072 + i) % 128``, so the GELU epilogue ran as a loop of its own
instead of inside the GEMM's tile).  Each side is built twice and their calls interleaved
(``harness.compare_sides``: the ratio, the error against PyTorch and whether the
bits equal old's, per model).

MODEL: any model ``harness.ab_model`` builds.
"""

from __future__ import annotations

from aicf_tvm import CompileOptions
from scripts.harness import old_new_main

if __name__ == "__main__":
    old_new_main(__doc__, CompileOptions(static_reshapes_by_group=False), ["gpt2", "bert", "llama", "vit"])
