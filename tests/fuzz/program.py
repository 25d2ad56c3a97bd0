"""A random Relax program as plain data, and the arrays it is run on.

A ``Program`` is inputs plus a list of steps; each step names an op, the values it reads
(by index: inputs first, then earlier steps) and JSON-able params. Keeping the program as
data (not as a Relax module) lets hypothesis shrink it and lets the fuzz script print it.
``relax_build.build_module`` turns it into a Relax module and ``numpy_eval.eval_numpy``
gives its meaning in numpy; both read constants and index arrays from the specs here, so
the two agree on every value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Shape = tuple  # ints, or "n" for the symbolic batch dim

# IEEE values where a rewrite that is exact on ordinary numbers can go wrong.
SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan])


@dataclass
class Step:
    op: str
    args: tuple[int, ...]
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Program:
    inputs: list[tuple[Shape, str]]
    steps: list[Step]
    outputs: tuple  # value indices; a nested tuple is a nested tuple output
    n: int = 3  # the run-time value of the symbolic dim "n"
    specials: tuple[int, ...] = ()  # inputs whose values include SPECIALS
    family: str = "graph"

    def __repr__(self) -> str:
        lines = [f"family={self.family!r}, inputs={self.inputs!r}, n={self.n}, specials={self.specials}"]
        lines += [f"  v{len(self.inputs) + i} = {s.op}{s.args} {s.params}" for i, s in enumerate(self.steps)]
        return "\n".join(lines + [f"  outputs={self.outputs}"])

    def to_json(self) -> str:
        """The program as JSON (NaN and infinities as Python's ``json`` writes them)."""
        return json.dumps({"inputs": self.inputs, "steps": [[st.op, st.args, st.params] for st in self.steps],
                           "outputs": self.outputs, "n": self.n, "specials": self.specials,
                           "family": self.family})

    @staticmethod
    def from_json(text: str) -> Program:
        """``to_json``'s program back, its tuples tuples again."""
        def tuples(value: Any) -> Any:
            return tuple(tuples(v) for v in value) if isinstance(value, list) else value

        d = json.loads(text)
        return Program([(tuple(shape), dtype) for shape, dtype in d["inputs"]],
                       [Step(op, tuple(args), params) for op, args, params in d["steps"]],
                       tuples(d["outputs"]), d["n"], tuple(d["specials"]), d["family"])

    def dtypes(self) -> set[str]:
        """Every dtype a value of the program has (inputs, constants, casts)."""
        out = {dt for _, dt in self.inputs}
        for s in self.steps:
            out |= {v["dtype"] for v in s.params.values() if isinstance(v, dict) and "dtype" in v}
            if isinstance(s.params.get("dtype"), str):
                out.add(s.params["dtype"])
        return out


def output_indices(outputs: Any) -> list[int]:
    """The value indices of a (nested) output tuple, depth first."""
    if isinstance(outputs, int):
        return [outputs]
    return [i for o in outputs for i in output_indices(o)]


def sprinkle(arr: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """About a third of the elements replaced by signed zeros, infinities and NaN."""
    out = np.array(arr)
    if out.size:
        mask = rng.random(out.shape) < 0.35
        out[mask] = rng.choice(SPECIALS, size=int(mask.sum())).astype(out.dtype)
    return out


def const_array(shape: Shape, seed: int, fill: str = "rand", dtype: str = "float32",
                value: float = 0.0) -> np.ndarray:
    """A constant's values. ``fill``: rand (normal), positive (|normal| + 0.5, e.g. a
    variance), zero, negzero, one, inf, neginf, nan, value (every element ``value``),
    causal (0 on and below the diagonal of the last two dims, ``value`` above: an attention
    mask) or special (normal with SPECIALS sprinkled in)."""
    shape = tuple(shape)
    full = {"zero": 0.0, "negzero": -0.0, "one": 1.0, "inf": np.inf, "neginf": -np.inf, "nan": np.nan,
            "value": value}
    if fill in full:
        return np.full(shape, full[fill], dtype)
    if fill == "causal":
        return np.broadcast_to(np.triu(np.full(shape[-2:], value), 1), shape).astype(dtype)
    rng = np.random.default_rng(seed)
    arr = rng.standard_normal(shape)
    if fill == "positive":
        return (np.abs(arr) + 0.5).astype(dtype)
    if fill == "special":
        return sprinkle(arr, rng).astype(dtype)
    return arr.astype(dtype)


def index_array(kind: str, shape: Shape, seed: int, dims: list[int], axis: int = 0,
                negative: bool = False, dtype: str = "int64") -> np.ndarray:
    """Indices the reference defines a meaning for.

    ``along`` (scatter/gather_elements): values in [0, dims[0]) along ``axis``, distinct
    along it (a scatter with a repeated index has no defined order); ``negative`` folds
    some of them to [-dims[0], 0), which scatter_elements reads from the end.
    ``nd`` (scatter/gather_nd): ``shape[0]`` distinct rows indexing the leading ``dims``.
    ``take``: values in [0, dims[0]), or for ``negative`` (take's wrap/clip modes) any
    value in [-2 dims[0], 2 dims[0]).
    """
    rng = np.random.default_rng(seed)
    shape = tuple(shape)
    if kind == "along":
        full = list(shape)
        full[axis] = dims[0]
        order = np.argsort(rng.random(full), axis=axis)
        out = np.take(order, np.arange(shape[axis]), axis=axis)
        if negative:
            out = np.where(rng.random(out.shape) < 0.5, out - dims[0], out)
    elif kind == "nd":
        flat = rng.permutation(int(np.prod(dims)))[: shape[0]]
        out = np.stack(np.unravel_index(flat, dims), axis=-1).reshape(shape)
    else:
        lo, hi = (-2 * dims[0], 2 * dims[0]) if negative else (0, dims[0])
        out = rng.integers(lo, hi, size=shape)
    return out.astype(dtype)


def concrete_shape(shape: Shape, n: int) -> tuple[int, ...]:
    return tuple(n if d == "n" else d for d in shape)


def random_inputs(prog: Program, seed: int = 0) -> list[np.ndarray]:
    """Normal values from one generator (distinct operands get distinct values), with
    SPECIALS in the inputs ``prog.specials`` names."""
    rng = np.random.default_rng(seed)
    return [make_input(rng, list(concrete_shape(shape, prog.n)), dtype, k in prog.specials)
            for k, (shape, dtype) in enumerate(prog.inputs)]


def make_input(rng: np.random.Generator, shape: list[int], dtype: str, special: bool = False) -> np.ndarray:
    """One input as ``random_inputs`` draws it (what a regression file replays)."""
    arr = np.asarray(rng.standard_normal(tuple(shape)))
    return (sprinkle(arr, rng) if special else arr).astype(dtype)


Ref = tuple  # ("in", k) or ("step", k): a value while a program is being built


class Builder:
    """Builds a ``Program`` in any order of inputs and steps (indices are fixed at the end,
    when the inputs are put first)."""

    def __init__(self, family: str) -> None:
        self.family = family
        self.inputs: list[tuple[Shape, str]] = []
        self.specials: list[int] = []
        self.steps: list[tuple[str, tuple[Ref, ...], dict]] = []

    def input(self, shape: Shape, dtype: str = "float32", special: bool = False) -> Ref:
        self.inputs.append((tuple(shape), dtype))
        if special:
            self.specials.append(len(self.inputs) - 1)
        return ("in", len(self.inputs) - 1)

    def step(self, op: str, *args: Ref, **params: Any) -> Ref:
        self.steps.append((op, args, params))
        return ("step", len(self.steps) - 1)

    def _index(self, ref: Ref) -> int:
        return ref[1] if ref[0] == "in" else len(self.inputs) + ref[1]

    def _outputs(self, outs: Any) -> Any:
        if isinstance(outs, tuple) and outs and isinstance(outs[0], str):
            return self._index(outs)
        return tuple(self._outputs(o) for o in outs)

    def build(self, outputs: Any) -> Program:
        """``outputs``: one Ref, or a (nested) tuple of Refs."""
        steps = [Step(op, tuple(self._index(a) for a in args), params) for op, args, params in self.steps]
        outs = self._outputs(outputs)
        return Program(list(self.inputs), steps, outs if isinstance(outs, tuple) else (outs,),
                       specials=tuple(self.specials), family=self.family)
