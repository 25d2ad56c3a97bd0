"""Where the generators' random choices come from: hypothesis (shrinkable) or a seeded RNG.

Every generator takes a ``Draw``. ``HypothesisDraw`` wraps a hypothesis ``draw`` so that a
failing program shrinks (``scripts/fuzz.py``); ``RandomDraw`` makes the same generators a
plain function of an integer seed, so the CI profile is a fixed list of (family, seed)
pairs that pytest runs as separate cases and ``--stats`` can enumerate without running.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from hypothesis import strategies as st

T = TypeVar("T")

# Sizes where tiled and vectorized code changes shape: around powers of two (full tiles,
# one-element tails, tails one short of a vector), a few primes, and the extremes.
EDGE_SIZES = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 48, 63, 64, 65, 96, 127, 128, 129,
              191, 255, 256, 257, 300)


class Draw(Protocol):
    def int(self, lo: int, hi: int) -> int: ...

    def choice(self, options: Sequence[T]) -> T: ...

    def coin(self) -> bool: ...

    def perm(self, n: int) -> list[int]: ...

    def subset(self, n: int, min_size: int, max_size: int) -> list[int]: ...


class HypothesisDraw:
    def __init__(self, draw: Any) -> None:
        self._draw = draw

    def int(self, lo: int, hi: int) -> int:
        return self._draw(st.integers(lo, hi))

    def choice(self, options: Sequence[T]) -> T:
        return self._draw(st.sampled_from(list(options)))

    def coin(self) -> bool:
        return self._draw(st.booleans())

    def perm(self, n: int) -> list[int]:
        return list(self._draw(st.permutations(range(n))))

    def subset(self, n: int, min_size: int, max_size: int) -> list[int]:
        return sorted(self._draw(st.sets(st.integers(0, n - 1), min_size=min_size, max_size=max_size)))


class RandomDraw:
    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def int(self, lo: int, hi: int) -> int:
        return self._rng.randint(lo, hi)

    def choice(self, options: Sequence[T]) -> T:
        return self._rng.choice(list(options))

    def coin(self) -> bool:
        return self._rng.random() < 0.5

    def perm(self, n: int) -> list[int]:
        out = list(range(n))
        self._rng.shuffle(out)
        return out

    def subset(self, n: int, min_size: int, max_size: int) -> list[int]:
        k = self._rng.randint(min_size, max_size)
        return sorted(self._rng.sample(range(n), k))


def size(d: Draw, lo: int, hi: int) -> int:
    """A dimension in [lo, hi]: an edge size half of the time, else uniform."""
    edges = [s for s in EDGE_SIZES if lo <= s <= hi]
    if edges and d.coin():
        return d.choice(edges)
    return d.int(lo, hi)


def seed(d: Draw) -> int:
    """The seed of a constant's values."""
    return d.int(0, 2**16)
