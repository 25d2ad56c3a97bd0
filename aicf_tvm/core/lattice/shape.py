"""Shape/stride facts of a tensor (docs/design.md §3 C).

``Unknown ⊒ Rank(r) ⊒ Shape(dims) ⊒ Strided(dims, strides)``. A dim or stride is an
``int``, a symbolic expression (``str``, e.g. ``"n"`` or ``"768*n"``) or ``None``
(unknown); per position they form a flat lattice, and the whole fact is the smash
product of those with one shared ``⊥`` (a rank or extent contradiction).
Contiguous means row-major strides.

Beside them, the **layout** of the storage: ``None`` is ⊤ ("any layout": nothing is
known, or, in a requirement, anything goes), a name such as ``"NCHW16c"`` says the
tensor holds a logical NCHW tensor with channel ``c`` at ``[n, c // 16, h, w, c % 16]``.
Distinct names are incomparable (a flat lattice: their meet is ⊥, their join ⊤), so a
kernel that requires ``NCHW16c`` is entailed only by that very layout. Plain results
carry ⊤: an op reads a 4-D tensor as its own attrs say (``data_layout``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

Dim = int | str | None
UNKNOWN_DIM = "?"


def mul_dims(a: Dim, b: Dim) -> Dim:
    """Product of two extents, symbolic expressions kept in a canonical ``c*x*y`` form."""
    if a is None or b is None:
        return None
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    coeff, syms = 1, []
    for d in (a, b):
        for factor in str(d).split("*"):
            if factor.lstrip("-").isdigit():
                coeff *= int(factor)
            else:
                syms.append(factor)
    if coeff == 0:
        return 0
    if not syms:
        return coeff
    return "*".join(([str(coeff)] if coeff != 1 else []) + sorted(syms))


def row_major(dims: Sequence[Dim]) -> tuple[Dim, ...]:
    """Row-major (C-contiguous) strides, in elements."""
    return _row_major(tuple(dims))


@functools.lru_cache(maxsize=65536)
def _row_major(dims: tuple) -> tuple[Dim, ...]:
    out: list[Dim] = []
    acc: Dim = 1
    for d in reversed(dims):
        out.append(acc)
        acc = mul_dims(acc, d)
    return tuple(reversed(out))


def _meet_dim(a: Dim, b: Dim) -> tuple[bool, Dim]:
    if a is None:
        return True, b
    if b is None or a == b:
        return True, a
    return False, None


@dataclass(frozen=True)
class ShapeFact:
    """What is known of a tensor's rank, extents and strides."""

    dims: tuple[Dim, ...] | None = None
    strides: tuple[Dim, ...] | None = None
    is_bottom: bool = False
    layout: str | None = None  # None: ⊤, any layout

    def __post_init__(self) -> None:
        if self.dims is not None:
            object.__setattr__(self, "dims", tuple(self.dims))
        if self.strides is not None:
            strides = tuple(self.strides)
            if self.dims is None or len(strides) != len(self.dims):
                raise ValueError("ShapeFact: strides need dims of the same rank")
            object.__setattr__(self, "strides", None if all(s is None for s in strides) else strides)
        if self.is_bottom and (self.dims is not None or self.strides is not None or self.layout is not None):
            object.__setattr__(self, "dims", None)
            object.__setattr__(self, "strides", None)
            object.__setattr__(self, "layout", None)

    # -- constructors ---------------------------------------------------------------
    @classmethod
    def top(cls) -> ShapeFact:
        return cls()

    @classmethod
    def bottom(cls) -> ShapeFact:
        return cls(is_bottom=True)

    @classmethod
    def rank(cls, r: int) -> ShapeFact:
        return cls((None,) * r)

    @classmethod
    def shape(cls, dims: Sequence[Dim]) -> ShapeFact:
        return cls(tuple(dims))

    @classmethod
    def contiguous(cls, dims: Sequence[Dim]) -> ShapeFact:
        return cls(tuple(dims), row_major(dims))

    def with_layout(self, layout: str | None) -> ShapeFact:
        """This fact with the given layout component (⊥ stays ⊥)."""
        if self.is_bottom or layout == self.layout:
            return self
        return ShapeFact(self.dims, self.strides, layout=layout)

    # -- queries --------------------------------------------------------------------
    @property
    def ndim(self) -> int | None:
        return None if self.dims is None else len(self.dims)

    def is_top(self) -> bool:
        return self.dims is None and self.layout is None and not self.is_bottom

    def is_contiguous(self) -> bool:
        """Strides proven row-major (extent-1 axes may carry any stride)."""
        if self.dims is None or self.strides is None:
            return False
        expect = row_major(self.dims)
        return all(
            d == 1 or (s is not None and s == e) for d, s, e in zip(self.dims, self.strides, expect)
        )

    def is_static(self) -> bool:
        return self.dims is not None and all(isinstance(d, int) for d in self.dims)

    def numel(self) -> Dim:
        if self.dims is None:
            return None
        n: Dim = 1
        for d in self.dims:
            n = mul_dims(n, d)
        return n

    # -- lattice --------------------------------------------------------------------
    def leq(self, other: ShapeFact) -> bool:
        if self.is_bottom:
            return True
        if other.is_bottom:
            return False
        if other.layout is not None and self.layout != other.layout:
            return False
        if other.dims is None:
            return True
        if self.dims is None or len(self.dims) != len(other.dims):
            return False
        if not all(b is None or a == b for a, b in zip(self.dims, other.dims)):
            return False
        if other.strides is None:
            return True
        mine = self.strides or (None,) * len(self.dims)
        return all(b is None or a == b for a, b in zip(mine, other.strides))

    def join(self, other: ShapeFact) -> ShapeFact:
        if self.is_bottom:
            return other
        if other.is_bottom:
            return self
        return self._join_dims(other).with_layout(self.layout if self.layout == other.layout else None)

    def _join_dims(self, other: ShapeFact) -> ShapeFact:
        if self.dims is None or other.dims is None or len(self.dims) != len(other.dims):
            return ShapeFact()
        dims = tuple(a if a == b else None for a, b in zip(self.dims, other.dims))
        if self.strides is None or other.strides is None:
            return ShapeFact(dims)
        return ShapeFact(dims, tuple(a if a == b else None for a, b in zip(self.strides, other.strides)))

    def meet(self, other: ShapeFact) -> ShapeFact:
        if self.is_bottom or other.is_bottom:
            return ShapeFact.bottom()
        if self.layout is not None and other.layout is not None and self.layout != other.layout:
            return ShapeFact.bottom()
        return self._meet_dims(other).with_layout(self.layout or other.layout)

    def _meet_dims(self, other: ShapeFact) -> ShapeFact:
        if self.dims is None:
            return other
        if other.dims is None:
            return self
        if len(self.dims) != len(other.dims):
            return ShapeFact.bottom()
        dims = []
        for a, b in zip(self.dims, other.dims):
            ok, d = _meet_dim(a, b)
            if not ok:
                return ShapeFact.bottom()
            dims.append(d)
        if self.strides is None or other.strides is None:
            return ShapeFact(tuple(dims), self.strides or other.strides)
        strides = []
        for a, b in zip(self.strides, other.strides):
            ok, s = _meet_dim(a, b)
            if not ok:
                return ShapeFact.bottom()
            strides.append(s)
        return ShapeFact(tuple(dims), tuple(strides))

    # -- encoding -------------------------------------------------------------------
    def to_json(self) -> dict:
        if self.is_bottom:
            return {"bottom": True}
        out: dict = {}
        if self.dims is not None:
            out["dims"] = [UNKNOWN_DIM if d is None else d for d in self.dims]
        if self.strides is not None:
            out["strides"] = [UNKNOWN_DIM if s is None else s for s in self.strides]
        if self.layout is not None:
            out["layout"] = self.layout
        return out

    @classmethod
    def from_json(cls, data: dict) -> ShapeFact:
        if data.get("bottom"):
            return cls.bottom()

        def dec(xs):
            return None if xs is None else tuple(None if x == UNKNOWN_DIM else _dim(x) for x in xs)

        layout = data.get("layout")
        return cls(dec(data.get("dims")), dec(data.get("strides")), layout=None if layout is None else str(layout))

    def show(self) -> str:
        shown = self._show_dims()
        return shown if self.layout is None else f"{shown} {self.layout}"

    def _show_dims(self) -> str:
        if self.is_bottom:
            return "⊥"
        if self.dims is None:
            return "?"
        dims = "x".join("?" if d is None else str(d) for d in self.dims) or "scalar"
        if self.strides is None:
            return f"[{dims}]"
        if self.is_contiguous():
            return f"[{dims}] contiguous"
        strides = ",".join("?" if s is None else str(s) for s in self.strides)
        return f"[{dims}] strides({strides})"


def _dim(x) -> Dim:
    if isinstance(x, bool):
        raise ValueError(f"ShapeFact: bad extent {x!r}")  # noqa: TRY004 - a bad value, as for a negative extent
    if isinstance(x, int):
        return x
    s = str(x)
    return int(s) if s.lstrip("-").isdigit() else s
