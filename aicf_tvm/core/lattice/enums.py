"""Finite lattices of named elements: Effect, Alias, and the numeric chains.

Each is a frozen value wrapping one element name, ordered by a ``FinitePoset``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..errors import AliasContradiction
from .base import FinitePoset


@dataclass(frozen=True)
class EnumLattice:
    """A lattice value that is one element of the class's finite poset."""

    value: str
    POSET: ClassVar[FinitePoset]
    TOP: ClassVar[str]
    BOTTOM: ClassVar[str]

    def __post_init__(self) -> None:
        if self.value not in self.POSET.elements:
            raise ValueError(f"{type(self).__name__}: unknown element {self.value!r}")

    @classmethod
    def top(cls):
        return cls(cls.TOP)

    @classmethod
    def bottom(cls):
        return cls(cls.BOTTOM)

    def leq(self, other) -> bool:
        return self.POSET.leq(self.value, other.value)

    def join(self, other):
        if self.value == other.value:
            return self
        return type(self)(self.POSET.join(self.value, other.value))

    def meet(self, other):
        if self.value == other.value:
            return self
        return type(self)(self.POSET.meet(self.value, other.value))

    def is_top(self) -> bool:
        return self.value == self.TOP

    def to_json(self) -> str:
        return self.value

    @classmethod
    def from_json(cls, data: str):
        return cls(str(data))

    def show(self) -> str:
        return self.value

    @classmethod
    def all(cls) -> list:
        return [cls(e) for e in cls.POSET.elements]


@dataclass(frozen=True)
class Effect(EnumLattice):
    """What an Emit does to one tensor port: the diamond None ⊑ Read, Write ⊑ ReadWrite.

    The seed's chain None < Read < Write < ReadWrite is a linear extension, used by
    ``rank`` to order conflicts.
    """

    POSET: ClassVar = FinitePoset(
        ["None", "Read", "Write", "ReadWrite"],
        [("None", "Read"), ("None", "Write"), ("Read", "ReadWrite"), ("Write", "ReadWrite")],
    )
    TOP: ClassVar = "ReadWrite"
    BOTTOM: ClassVar = "None"

    @property
    def reads(self) -> bool:
        return self.value in ("Read", "ReadWrite")

    @property
    def writes(self) -> bool:
        return self.value in ("Write", "ReadWrite")

    @property
    def rank(self) -> int:
        return ["None", "Read", "Write", "ReadWrite"].index(self.value)


NONE, READ, WRITE, READWRITE = (Effect(v) for v in ("None", "Read", "Write", "ReadWrite"))


@dataclass(frozen=True)
class Alias(EnumLattice):
    """Aliasing of a pair of values: MustAlias, NoAlias ⊑ MayAlias ⊑ Unknown.

    ``⊥`` (``Contradiction``) is MustAlias ⊓ NoAlias; ``refine`` raises instead of
    producing it, naming both sources.
    """

    POSET: ClassVar = FinitePoset(
        ["Contradiction", "MustAlias", "NoAlias", "MayAlias", "Unknown"],
        [
            ("Contradiction", "MustAlias"),
            ("Contradiction", "NoAlias"),
            ("MustAlias", "MayAlias"),
            ("NoAlias", "MayAlias"),
            ("MayAlias", "Unknown"),
        ],
    )
    TOP: ClassVar = "Unknown"
    BOTTOM: ClassVar = "Contradiction"

    def refine(self, other: Alias, self_source: str, other_source: str) -> Alias:
        """``self ⊓ other``, raising ``AliasContradiction`` where that is ⊥."""
        out = self.meet(other)
        if out.value == "Contradiction" and not (self.value == other.value == "Contradiction"):
            must, no = (self_source, other_source) if self.value == "MustAlias" else (other_source, self_source)
            raise AliasContradiction(must, no)
        return out


MUST_ALIAS, NO_ALIAS, MAY_ALIAS, UNKNOWN_ALIAS = (
    Alias(v) for v in ("MustAlias", "NoAlias", "MayAlias", "Unknown")
)


@dataclass(frozen=True)
class AccumDtype(EnumLattice):
    """Accumulation dtype, wider ⊑ narrower: float64 ⊑ float32 ⊑ float16 | bfloat16.

    Integer accumulation forms its own chain (int64 ⊑ int32 ⊑ int16 ⊑ int8); a float
    and an integer accumulator have only ⊤ ("any") above and ⊥ below.
    """

    POSET: ClassVar = FinitePoset(
        ["⊥", "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "any"],
        [
            ("⊥", "float64"), ("float64", "float32"), ("float32", "float16"),
            ("float32", "bfloat16"), ("float16", "any"), ("bfloat16", "any"),
            ("⊥", "int64"), ("int64", "int32"), ("int32", "int16"), ("int16", "int8"),
            ("int8", "any"),
        ],
    )
    TOP: ClassVar = "any"
    BOTTOM: ClassVar = "⊥"

    @classmethod
    def of(cls, dtype: str) -> AccumDtype:
        """The accumulation fact of computing natively in ``dtype``."""
        d = str(dtype)
        if d in cls.POSET.elements:
            return cls(d)
        if d.startswith("uint"):
            return cls(d[1:]) if d[1:] in cls.POSET.elements else cls.top()
        return cls("int8") if d == "bool" else cls.top()


@dataclass(frozen=True)
class Determinism(EnumLattice):
    """``deterministic ⊑ nondeterministic`` (e.g. atomics make a result run-dependent)."""

    POSET: ClassVar = FinitePoset(["deterministic", "nondeterministic"], [("deterministic", "nondeterministic")])
    TOP: ClassVar = "nondeterministic"
    BOTTOM: ClassVar = "deterministic"


@dataclass(frozen=True)
class Rounding(EnumLattice):
    """``rne`` (IEEE round-to-nearest-even on every op) ⊑ ``unspecified``."""

    POSET: ClassVar = FinitePoset(["rne", "unspecified"], [("rne", "unspecified")])
    TOP: ClassVar = "unspecified"
    BOTTOM: ClassVar = "rne"


@dataclass(frozen=True)
class Flag(EnumLattice):
    """A boolean guarantee: ``yes`` (guaranteed / required) ⊑ ``no`` (not guaranteed)."""

    POSET: ClassVar = FinitePoset(["yes", "no"], [("yes", "no")])
    TOP: ClassVar = "no"
    BOTTOM: ClassVar = "yes"

    @classmethod
    def of(cls, value: bool) -> Flag:
        return cls("yes" if value else "no")

    def __bool__(self) -> bool:
        return self.value == "yes"
