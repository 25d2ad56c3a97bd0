"""Predicates of elimination (docs/design.md §5): when the facts prove an Emit is a no-op.

Small pure functions over Emits and lattice facts, tested on their own; the
``EliminateEmits`` pass applies them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .lattice import ShapeFact

if TYPE_CHECKING:
    from tvm import relax

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


def is_identity_permutation(axes: list[int] | None, ndim: int) -> bool:
    return axes is not None and [int(a) % ndim for a in axes] == list(range(ndim))


def compose_permutations(first: list[int], second: list[int]) -> list[int]:
    """Axes of ``permute(permute(x, first), second)`` as one permutation of x."""
    return [first[a] for a in second]


def is_free_view(src: ShapeFact, dst_dims: tuple) -> bool:
    """A reshape/squeeze/expand_dims/flatten is a view when its input is proven row-major:
    the output then has row-major strides over the same storage. Symbolic dims included:
    row-major strides proven as expressions of the dims hold for every binding."""
    return src.is_contiguous() and dst_dims is not None


# x op c == x bit for bit for every x (signed zeros, infinities and NaN included) when c,
# on the side given, is this value. x + 0.0 is not an identity: -0.0 + 0.0 = +0.0, so
# 1 / (x + 0.0) turns -inf into +inf; x + (-0.0) is. Likewise x - 0.0 is and x - (-0.0)
# is not. For integers both zeros are the same 0. Deliberately absent: x * 0 (inf * 0 is
# NaN, -1 * 0 is -0.0), 0 / x, x - x (inf - inf is NaN), max(x, x) / min(x, x) (our Emits
# never see them as such), x ** 1 (left to the backend).
RIGHT_NEUTRAL = {"add": -0.0, "subtract": 0.0, "multiply": 1.0, "divide": 1.0}
LEFT_NEUTRAL = {"add": -0.0, "multiply": 1.0}


def is_constant_fill(value: relax.Expr, fill: float) -> bool:
    """A Relax constant whose every element is ``fill`` exactly: for floats by value and
    sign bit (-0.0 is not 0.0), so a NaN constant matches nothing."""
    data = getattr(value, "value", None)
    if data is None or not hasattr(data, "numpy"):
        return False
    arr = data.numpy()
    if arr.size == 0 or arr.dtype.kind not in "fiu":
        return False  # bool, bfloat16 and other types without a numpy arithmetic: never
    want = np.array(fill).astype(arr.dtype)
    same = arr == want
    if arr.dtype.kind == "f":
        same &= np.signbit(arr) == np.signbit(want)
    return bool(np.all(same))


def is_neutral_operand(kind: str, value: relax.Expr, right: bool) -> bool:
    """Whether ``value`` on the given side of binary Emit ``kind`` leaves the other
    operand unchanged for every value it may take (IEEE signed zeros and NaN included)."""
    fill = (RIGHT_NEUTRAL if right else LEFT_NEUTRAL).get(kind)
    return fill is not None and is_constant_fill(value, fill)
