"""What a compiled model checks when it is called: shape requirements and gather indices.

Two kinds of facts cannot be decided when the model is compiled, only when it is called:

* **Shape requirements** over the model's symbolic input dims. An op makes one when its
  output shape is only right if its operands' dims are related: a matmul of ``[a, b]`` by a
  ``[16, 8]`` weight is typed ``[a, 8]`` only if ``b == 16`` (else its kernel reads past the
  weight), a slice of a 16-row table to ``seq`` rows that the frontend assumes in bounds
  needs ``seq <= 16``. ``relax_passes.shape_requirements`` derives them at compile time; a
  ``Requirement`` holds one as a small JSON expression over the dim names (it travels in an
  exported library's metadata) and ``check_requirements`` evaluates them with the dims of
  the arrays given, in Python, before any kernel runs.
* **Indices from data** (an embedding's token ids): ``relax_passes.index_checks`` puts a
  check kernel in front of each gather whose indices are not proven in range; on an index
  out of range it calls ``aicf.index_out_of_range`` (registered here, so it exists in every
  process that imports ``aicf_tvm``, runtime-only ones included), which raises our
  ``InputError`` through the FFI naming the indices, the offending index and the bound.

Only numpy and TVM's FFI are imported: ``aicf_tvm.load`` runs where only TVM's runtime is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm_ffi

from aicf_tvm.core.errors import InputError

if TYPE_CHECKING:
    import tvm

# A dim expression as JSON: an int, a dim name, or [operator, operand, ...].
DimExpr = int | str | list

_BINARY = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "//": lambda a, b: a // b if b else None, "%": lambda a, b: a % b if b else None,
    "min": min, "max": max, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    "and": lambda a, b: bool(a) and bool(b), "or": lambda a, b: bool(a) or bool(b),
}
# How tightly each infix operator binds (Python's order), and which may chain unbracketed.
_RANK = {"or": 0, "and": 1, "==": 2, "!=": 2, "<": 2, "<=": 2, "+": 3, "-": 3, "*": 4, "//": 4,
         "%": 4}
_INFIX = set(_RANK)
_ASSOCIATIVE = {"or", "and", "+", "*"}


def evaluate(expr: DimExpr, dims: Mapping[str, int]) -> int | None:
    """The value of ``expr`` with each dim name bound by ``dims`` (Python ints: no overflow;
    ``//`` and ``%`` floor as TIR's floordiv/floormod do; a division by zero is None)."""
    if isinstance(expr, (bool, int)):
        return int(expr)
    if isinstance(expr, str):
        return dims[expr]
    op, *args = expr
    values = [evaluate(a, dims) for a in args]
    if any(v is None for v in values):
        return None
    if op == "not":
        return not values[0]
    if op == "select":
        return values[1] if values[0] else values[2]
    return _BINARY[op](*values)


def render(expr: DimExpr) -> str:
    """``expr`` as text: ``b == 16``, ``a * b == 128``, ``b == 1 or b == 16``,
    ``(a * b) % 8 == 0``: an operand in parentheses unless it binds tighter (or is the
    same associative operator)."""
    if isinstance(expr, (int, str)):
        return str(expr)
    op, *args = expr
    if op not in _INFIX:
        return f"{op}({', '.join(render(a) for a in args)})"
    parts = []
    for k, arg in enumerate(args):
        inner = arg[0] if isinstance(arg, list) and arg[0] in _INFIX else None
        loose = inner is not None and (_RANK[inner] < _RANK[op] or (
            _RANK[inner] == _RANK[op] and (k > 0 or inner != op or op not in _ASSOCIATIVE)))
        parts.append(f"({render(arg)})" if loose else render(arg))
    return f" {op} ".join(parts)


def names_in(expr: DimExpr) -> list[str]:
    """The dim names ``expr`` reads, in order of first appearance."""
    if isinstance(expr, str):
        return [expr]
    if isinstance(expr, int):
        return []
    out: list[str] = []
    for arg in expr[1:]:
        out += [n for n in names_in(arg) if n not in out]
    return out


# A bound dim: (its size, the input that gave it, the axis of that input).
BoundDim = tuple[int, str, int]


def _compiled(expr: DimExpr) -> Callable[[Mapping[str, BoundDim]], int | None]:
    """``evaluate`` of ``expr`` as a tree of closures over bound dims, built once: a model
    checks its requirements at every call."""
    if isinstance(expr, (bool, int)):
        return lambda dims, v=int(expr): v
    if isinstance(expr, str):
        return lambda dims: dims[expr][0]
    op, *args = expr
    parts = [_compiled(a) for a in args]
    if op == "not":
        return lambda dims: not parts[0](dims)
    if op == "select":
        return lambda dims: parts[1](dims) if parts[0](dims) else parts[2](dims)
    fn, left, right = _BINARY[op], parts[0], parts[1]
    if op in ("//", "%"):  # None for a division by zero, as evaluate

        def divide(dims: Mapping[str, BoundDim]) -> int | None:
            a, b = left(dims), right(dims)
            return None if a is None or b is None else fn(a, b)

        return divide
    return lambda dims: fn(left(dims), right(dims))


@dataclass(frozen=True)
class Requirement:
    """One relation the model's input dims must satisfy at a call, and who requires it."""

    expr: DimExpr  # boolean
    op: str  # the op that requires it, with its operands: "matmul of input x and a constant ..."
    role: str  # why: "its contraction dims"

    def to_json(self) -> dict:
        return {"expr": self.expr, "op": self.op, "role": self.role}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Requirement:
        return cls(data["expr"], str(data["op"]), str(data["role"]))

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(names_in(self.expr))

    @cached_property
    def holds(self) -> Callable[[Mapping[str, BoundDim]], int | None]:
        """Whether the bound dims meet it (each name bound)."""
        return _compiled(self.expr)

    def __str__(self) -> str:
        return render(self.expr)


def check_requirements(requirements: Sequence[Requirement], dims: Mapping[str, BoundDim]) -> None:
    """Raise ``InputError`` for the first requirement the bound ``dims`` break, naming each
    input and dim it reads; a requirement over a dim no input binds is not checked here."""
    for req in requirements:
        if req.holds(dims) if all(n in dims for n in req.names) else True:
            continue
        given = ", ".join(f"input {dims[n][1]}: dim {n} = {dims[n][0]} (axis {dims[n][2]})"
                          for n in req.names)
        raise InputError(f"{given}, but {req.op} requires {req} ({req.role}); give inputs whose "
                         f"dims satisfy it")


@tvm_ffi.register_global_func("aicf.index_out_of_range")
def index_out_of_range(subject: str, op: str, value: int, low: int, high: int, dtype: str,
                       *position: int) -> None:
    """Called by a check kernel (``relax_passes.index_checks``) on the first index outside
    ``[low, high)``: raises ``InputError`` naming the indices, the index, where it sits and
    the bound. ``value`` crosses the FFI as an int64: a uint64 index is read back."""
    value = int(value) + (1 << 64) if dtype == "uint64" and int(value) < 0 else int(value)
    at = f" at [{', '.join(str(int(p)) for p in position)}]" if position else ""
    raise InputError(f"{subject}: index {int(value)}{at} is out of range [{int(low)}, {int(high)}) "
                     f"of {op}; give indices in that range")


def check_values(values: np.ndarray, extents: Sequence[int], from_end: bool
                 ) -> tuple[np.ndarray, tuple[int, tuple, int, int] | None]:
    """``values`` checked against ``extents`` (one, or one per position of the last axis)
    as a check kernel checks them: the values with negative ones counted from the end (when
    ``from_end``), and the first one out of range as (value, position, low, high), or None."""
    n = np.array(list(extents) if len(extents) > 1 else extents[0], dtype=np.int64)
    if values.dtype == np.uint64:  # beyond int64: compared as unsigned
        low, bad, fixed = np.zeros_like(n), values >= n.astype(np.uint64), values
    else:
        wide = values.astype(np.int64)
        low = -n if from_end and values.dtype.kind == "i" else np.zeros_like(n)
        bad, fixed = (wide < low) | (wide >= n), np.where(wide < 0, wide + n, wide)
    if not bad.any():
        return fixed, None
    at = tuple(int(k) for k in np.argwhere(bad)[0])
    pick = () if n.ndim == 0 else (at[-1],)
    return fixed, (int(values[at]), at, int(low[pick]), int(n[pick]))


def check_indices_on_host(indices: tvm.runtime.Tensor, subject: str, op: str, from_end: int,
                          out_dtype: str, *extents: int) -> tvm.runtime.Tensor:
    """What a check kernel computes, on the host (for targets whose kernels cannot call the
    host, CUDA): ``indices`` checked (``check_values``); returns them in ``out_dtype`` as a
    tensor on the indices' device."""
    import tvm  # the runtime, loaded already: this runs inside a model's call

    arr = indices.numpy()
    fixed, bad = check_values(arr, [int(e) for e in extents], bool(from_end))
    if bad is not None:
        value, at, low, high = bad
        index_out_of_range(subject, op, value, low, high, str(arr.dtype), *at)
    return tvm.runtime.tensor(fixed.astype(out_dtype), indices.device)


tvm_ffi.register_global_func("aicf.check_indices_on_host", check_indices_on_host)

__all__ = ["BoundDim", "Requirement", "check_indices_on_host", "check_requirements", "check_values",
           "evaluate", "index_out_of_range", "names_in", "render"]
