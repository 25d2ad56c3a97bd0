"""The Emit library: fused Emit candidates with Requires / Build / Derive (docs/design.md §4).

Library candidates are tried by benefit; ``fused_elementwise`` and
``fused_reduce_epilogue`` are the generic groups FuseEmits forms around what is left.
"""

from __future__ import annotations

from aicf_tvm.core.candidate import Candidate, Match, register_candidates
from aicf_tvm.core.kinds.adam import ADAM_KINDS

from .attention import ATTENTION
from .gemm import CONV, GEMM, gemm_candidate
from .norms import LAYERNORM, RMSNORM, SOFTMAX

GENERIC_KINDS = ("fused_elementwise", "fused_reduce_epilogue")

DEFAULT_CANDIDATES: tuple[Candidate, ...] = (ATTENTION, GEMM, CONV, LAYERNORM, RMSNORM, SOFTMAX)
register_candidates(*DEFAULT_CANDIDATES)


def library_kinds() -> list[str]:
    """Names of the fused kinds the library can build."""
    return sorted({c.kind for c in DEFAULT_CANDIDATES} | set(GENERIC_KINDS) | set(ADAM_KINDS))


__all__ = [
    "ATTENTION",
    "CONV",
    "DEFAULT_CANDIDATES",
    "GEMM",
    "GENERIC_KINDS",
    "LAYERNORM",
    "RMSNORM",
    "SOFTMAX",
    "Candidate",
    "Match",
    "gemm_candidate",
    "library_kinds",
]
