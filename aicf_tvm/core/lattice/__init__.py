"""The five contract lattices of docs/design.md §3, one convention: ``a ⊑ b`` = a is stronger."""

from .abi import ABIFact, Alignment
from .base import Failure, FinitePoset, ProductLattice, explain_leq
from .enums import (
    MAY_ALIAS,
    MUST_ALIAS,
    NO_ALIAS,
    NONE,
    READ,
    READWRITE,
    UNKNOWN_ALIAS,
    WRITE,
    AccumDtype,
    Alias,
    Determinism,
    Effect,
    Flag,
    Rounding,
)
from .numeric import MathTag, NumericFact
from .shape import Dim, ShapeFact, mul_dims, row_major

__all__ = [
    "MAY_ALIAS",
    "MUST_ALIAS",
    "NONE",
    "NO_ALIAS",
    "READ",
    "READWRITE",
    "UNKNOWN_ALIAS",
    "WRITE",
    "ABIFact",
    "AccumDtype",
    "Alias",
    "Alignment",
    "Determinism",
    "Dim",
    "Effect",
    "Failure",
    "FinitePoset",
    "Flag",
    "MathTag",
    "NumericFact",
    "ProductLattice",
    "Rounding",
    "ShapeFact",
    "explain_leq",
    "mul_dims",
    "row_major",
]
