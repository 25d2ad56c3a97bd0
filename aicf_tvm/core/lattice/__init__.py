"""The five contract lattices of docs/design.md §3, one convention: ``a ⊑ b`` = a is stronger."""

from .abi import ABIFact, Alignment
from .base import Failure, FinitePoset, ProductLattice, explain_leq
from .enums import (
    MAY_ALIAS, MUST_ALIAS, NO_ALIAS, NONE, READ, READWRITE, UNKNOWN_ALIAS, WRITE,
    AccumDtype, Alias, Determinism, Effect, Flag, Rounding,
)
from .numeric import MathTag, NumericFact
from .shape import Dim, ShapeFact, mul_dims, row_major

__all__ = [
    "ABIFact", "Alignment", "Failure", "FinitePoset", "ProductLattice", "explain_leq",
    "MAY_ALIAS", "MUST_ALIAS", "NO_ALIAS", "NONE", "READ", "READWRITE", "UNKNOWN_ALIAS",
    "WRITE", "AccumDtype", "Alias", "Determinism", "Effect", "Flag", "Rounding",
    "MathTag", "NumericFact", "Dim", "ShapeFact", "mul_dims", "row_major",
]
