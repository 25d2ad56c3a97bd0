"""GEMM row blocks made parallel where column blocks split unevenly, against column blocks
alone, in one process: ``python -m scripts.ab_gemm_row_balance [MODEL ...]``.

Sides (``harness.old_new_main``): ``old``, ``CompileOptions(gemm_rows_for_balance=False)``:
the parallel loop over the column blocks alone, so 3 blocks on 2 cores leave one core
idle a third of the time (Swin's 784 x 768 -> 192 GEMMs); ``new``, the default build: where
the row blocks split the work more evenly, the parallel loop runs over both.
"""

from __future__ import annotations

from aicf_tvm import CompileOptions
from scripts.harness import old_new_main


def main() -> None:
    old_new_main(__doc__, CompileOptions(gemm_rows_for_balance=False), ["swin", "mobilenetv2", "whisper"])


if __name__ == "__main__":
    main()
