"""ABI facts of a tensor port, used only by final lowering (docs/design.md §3 E, §7)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import ProductLattice
from .enums import Flag

MAX_ALIGN = 4096


@dataclass(frozen=True)
class Alignment:
    """Byte alignment, a power of two: larger is stronger (64 ⊑ 16 ⊑ 1).

    Bounded by a page (``MAX_ALIGN`` is ⊥) so the lattice is finite.
    """

    bytes: int = 1

    def __post_init__(self) -> None:
        b = self.bytes
        if b < 1 or b > MAX_ALIGN or b & (b - 1):
            raise ValueError(f"Alignment: {b} is not a power of two in [1, {MAX_ALIGN}]")

    @classmethod
    def top(cls) -> Alignment:
        return cls(1)

    @classmethod
    def bottom(cls) -> Alignment:
        return cls(MAX_ALIGN)

    def leq(self, other: Alignment) -> bool:
        return self.bytes >= other.bytes

    def join(self, other: Alignment) -> Alignment:
        return Alignment(min(self.bytes, other.bytes))

    def meet(self, other: Alignment) -> Alignment:
        return Alignment(max(self.bytes, other.bytes))

    def is_top(self) -> bool:
        return self.bytes == 1

    def to_json(self) -> int:
        return self.bytes

    @classmethod
    def from_json(cls, data: int) -> Alignment:
        return cls(int(data))

    def show(self) -> str:
        return f"align{self.bytes}"


@dataclass(frozen=True)
class ABIFact(ProductLattice):
    """Alignment, rank-0 scalar view, explicit contiguity of a port's buffer."""

    alignment: Alignment = Alignment.top()
    scalar_view: Flag = Flag.top()
    contiguous: Flag = Flag.top()
