"""Numeric semantics of an Emit output (docs/design.md §3 D).

Four independent components, each a lattice; a fused kernel must not weaken any
of them unless the user's numeric level allows it for that Emit (``relaxed``:
``aicf_tvm.core.numerics``, which joins the Emit's math tag with ``approx:relaxed``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import ProductLattice
from .enums import AccumDtype, Determinism, Rounding


@dataclass(frozen=True)
class MathTag:
    """``exact`` ⊑ ``approx:<name>`` ⊑ ``approx`` (any approximation).

    Distinct named approximations are incomparable: their join is ``approx``, their
    meet ``exact`` (the only semantics both allow).
    """

    value: str = "exact"

    def __post_init__(self) -> None:
        if not (self.value in ("exact", "approx") or self.value.startswith("approx:")):
            raise ValueError(f"MathTag: {self.value!r} is neither 'exact' nor 'approx[:name]'")

    @classmethod
    def top(cls) -> MathTag:
        return cls("approx")

    @classmethod
    def bottom(cls) -> MathTag:
        return cls("exact")

    def leq(self, other: MathTag) -> bool:
        return self.value == "exact" or other.value == "approx" or self.value == other.value

    def join(self, other: MathTag) -> MathTag:
        if self.leq(other):
            return other
        return self if other.leq(self) else MathTag("approx")

    def meet(self, other: MathTag) -> MathTag:
        if self.leq(other):
            return self
        return other if other.leq(self) else MathTag("exact")

    def is_top(self) -> bool:
        return self.value == "approx"

    def to_json(self) -> str:
        return self.value

    @classmethod
    def from_json(cls, data: str) -> MathTag:
        return cls(str(data))

    def show(self) -> str:
        return self.value


@dataclass(frozen=True)
class NumericFact(ProductLattice):
    """Math tag, accumulation dtype, determinism and rounding of one output."""

    math: MathTag = MathTag.top()
    accumulation: AccumDtype = AccumDtype.top()
    determinism: Determinism = Determinism.top()
    rounding: Rounding = Rounding.top()

    @classmethod
    def exact(cls, dtype: str) -> NumericFact:
        """The strongest fact: exact math, native ``dtype`` accumulation, deterministic, RNE."""
        return cls(MathTag("exact"), AccumDtype.of(dtype), Determinism.bottom(), Rounding.bottom())
