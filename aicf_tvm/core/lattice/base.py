"""Shared machinery of the contract lattices.

Convention (docs/design.md §3): ``a ⊑ b`` reads "a guarantees at least what b guarantees";
``⊤`` is no guarantee, ``⊥`` a contradiction; ``join`` is the common guarantee,
``meet`` the conjunction of requirements. ``F ⊢ R`` iff ``F ⊑ R`` in every component.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, Self


@dataclass(frozen=True)
class Failure:
    """One component where a fact does not entail a requirement."""

    path: str
    have: Any
    required: Any

    def __str__(self) -> str:
        return f"{self.path}: {_show(self.have)} ⋢ {_show(self.required)}"


class LatticeValue(Protocol):
    """What ``explain_leq`` needs of a lattice value: the order."""

    def leq(self, other: Self, /) -> bool: ...


def _show(value: object) -> str:
    return value.show() if hasattr(value, "show") else str(value)


class FinitePoset:
    """A finite lattice given by its covering pairs ``(lower, upper)``.

    Join and meet are computed once from the transitive closure; the constructor
    fails if some pair has no unique least upper / greatest lower bound.
    """

    def __init__(self, elements: Iterable[str], covers: Iterable[tuple[str, str]]) -> None:
        self.elements = tuple(elements)
        below = {e: {e} for e in self.elements}
        changed = True
        pairs = list(covers)
        while changed:
            changed = False
            for lo, hi in pairs:
                new = below[lo] - below[hi]
                if new:
                    below[hi] |= new
                    changed = True
        self._below = {e: frozenset(s) for e, s in below.items()}
        self._join = {}
        self._meet = {}
        for a in self.elements:
            for b in self.elements:
                self._join[a, b] = self._extreme(
                    [u for u in self.elements if a in self._below[u] and b in self._below[u]], True
                )
                self._meet[a, b] = self._extreme(
                    [d for d in self.elements if d in self._below[a] and d in self._below[b]], False
                )

    def _extreme(self, cands: list[str], least: bool) -> str:
        for c in cands:
            if all((c in self._below[o]) if least else (o in self._below[c]) for o in cands):
                return c
        raise ValueError(f"not a lattice: bounds {cands} have no unique extreme")

    def leq(self, a: str, b: str) -> bool:
        return a in self._below[b]

    def join(self, a: str, b: str) -> str:
        return self._join[a, b]

    def meet(self, a: str, b: str) -> str:
        return self._meet[a, b]


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


class ProductLattice:
    """Mixin for frozen dataclasses whose fields are all lattice values.

    Order, join and meet are component-wise; ``explain_leq`` names each failing field.
    """

    def leq(self, other: Self) -> bool:
        return self is other or all(getattr(self, n).leq(getattr(other, n)) for n in _names(type(self)))

    def join(self, other: Self) -> Self:
        if self is other:
            return self
        return type(self)(*[getattr(self, n).join(getattr(other, n)) for n in _names(type(self))])

    def meet(self, other: Self) -> Self:
        if self is other:
            return self
        return type(self)(*[getattr(self, n).meet(getattr(other, n)) for n in _names(type(self))])

    @classmethod
    def top(cls) -> Self:
        return cls(**{f.name: _field_type(cls, f).top() for f in dataclasses.fields(cls)})

    @classmethod
    def bottom(cls) -> Self:
        return cls(**{f.name: _field_type(cls, f).bottom() for f in dataclasses.fields(cls)})

    def is_top(self) -> bool:
        return self == type(self).top()

    def explain_leq(self, other: Self, path: str) -> list[Failure]:
        out: list[Failure] = []
        for f in dataclasses.fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            out.extend(explain_leq(mine, theirs, f"{path}.{f.name}"))
        return out

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name).to_json() for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, data: dict) -> Self:
        return cls(**{f.name: _field_type(cls, f).from_json(data[f.name]) for f in dataclasses.fields(cls)})

    def show(self) -> str:
        parts = [f"{f.name}={_show(getattr(self, f.name))}" for f in dataclasses.fields(self)]
        return "(" + ", ".join(parts) + ")"


def _field_type(cls: type, field: dataclasses.Field) -> type:
    hint = field.type
    if isinstance(hint, str):
        import sys

        hint = eval(hint, vars(sys.modules[cls.__module__]))
    return hint


def explain_leq(have: LatticeValue, required: LatticeValue, path: str) -> list[Failure]:
    """Every failing component of ``have ⊑ required``, recursing into products."""
    if hasattr(have, "explain_leq"):
        return have.explain_leq(required, path)
    return [] if have.leq(required) else [Failure(path, have, required)]
