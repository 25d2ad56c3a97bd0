"""Predicates of elimination (DESIGN §5): when the facts prove an Emit is a no-op.

Small pure functions over Emits and lattice facts, tested on their own; the
``EliminateEmits`` pass applies them.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .lattice import ShapeFact

# B represents every value of A exactly (A -> B -> A is the identity).
_EXACT_WIDENINGS = {
    "bool": {"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "bfloat16",
             "float32", "float64"},
    "int8": {"int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"},
    "uint8": {"int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64"},
    "int16": {"int32", "int64", "float32", "float64"},
    "uint16": {"int32", "uint32", "int64", "uint64", "float32", "float64"},
    "int32": {"int64", "float64"},
    "uint32": {"int64", "uint64", "float64"},
    "float16": {"float32", "float64"},
    "bfloat16": {"float32", "float64"},
    "float32": {"float64"},
}


def represents_exactly(a: str, b: str) -> bool:
    """Whether dtype ``b`` holds every value of dtype ``a`` (so ``a -> b -> a`` is exact)."""
    return a == b or b in _EXACT_WIDENINGS.get(a, set())


def is_identity_permutation(axes: Optional[list[int]], ndim: int) -> bool:
    return axes is not None and [int(a) % ndim for a in axes] == list(range(ndim))


def compose_permutations(first: list[int], second: list[int]) -> list[int]:
    """Axes of ``permute(permute(x, first), second)`` as one permutation of x."""
    return [first[a] for a in second]


def is_free_view(src: ShapeFact, dst_dims: tuple) -> bool:
    """A reshape/squeeze/expand_dims/flatten is a view when its input is proven row-major:
    the output then has row-major strides over the same storage."""
    return src.is_contiguous() and src.is_static() and dst_dims is not None


def is_constant_fill(value: Any, fill: float) -> bool:
    """A Relax constant whose every element equals ``fill``."""
    data = getattr(value, "value", None)
    if data is None or not hasattr(data, "numpy"):
        return False
    arr = data.numpy()
    return arr.size > 0 and bool(np.all(arr == fill))
