"""What a set of programs reaches: sizes, ops, families, dtypes, as text histograms.

The output sizes come from the Relax module's return type, so listing a profile costs a
module build per program and no compile.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from itertools import pairwise
from typing import Any

from tvm import relax

from .program import Program, concrete_shape
from .relax_build import build_module

BUCKETS = (0, 1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)


def _elements(shape: tuple) -> int:
    total = 1
    for n in shape:
        total *= int(n)
    return total


def _output_shapes(ty: Any, n: int) -> list[tuple]:
    if isinstance(ty, relax.TensorType):
        dims = [d.value if hasattr(d, "value") else n for d in ty.shape.values]
        return [tuple(dims)]
    return [s for f in ty.fields for s in _output_shapes(f, n)]


def bucket(count: int) -> str:
    """The histogram bin of an element count: 0, 1, 2-4, 5-16, ... (powers of 4)."""
    return next((b for b, hi in _BINS if count <= hi), f">{BUCKETS[-1]}")


_BINS = [("0", 0), ("1", 1)] + [(f"{lo + 1}-{hi}", hi) for lo, hi in pairwise(BUCKETS[1:])]


class Stats:
    def __init__(self) -> None:
        self.count = 0
        self.max_input, self.output, self.ops, self.families, self.dtypes = (Counter() for _ in range(5))
        self.largest_input = self.largest_output = self.largest_const = 0

    def add(self, prog: Program) -> None:
        self.count += 1
        sizes = [_elements(concrete_shape(s, prog.n)) for s, _ in prog.inputs] or [0]
        outs = _output_shapes(build_module(prog)["main"].ret_ty, prog.n)
        out_total = sum(_elements(s) for s in outs)
        self.max_input[bucket(max(sizes))] += 1
        self.output[bucket(out_total)] += 1
        self.largest_input = max(self.largest_input, max(sizes))
        self.largest_output = max(self.largest_output, out_total)
        consts = [v["shape"] for s in prog.steps for v in s.params.values()
                  if isinstance(v, dict) and "shape" in v and "kind" not in v]  # not index arrays
        self.largest_const = max([self.largest_const] + [_elements(c) for c in consts])
        self.ops.update({s.op for s in prog.steps})
        self.families[prog.family] += 1
        self.dtypes.update(prog.dtypes())

    def report(self) -> str:
        order = [b for b, _ in _BINS] + [f">{BUCKETS[-1]}"]
        lines = [(f"{self.count} programs; largest input {self.largest_input}, output {self.largest_output}, "
                  f"constant {self.largest_const} elements")]
        for title, counter in (("max input elements", self.max_input), ("output elements", self.output)):
            lines.append(f"{title}:")
            lines += [f"  {b:>13} {counter[b]:4d} {'#' * counter[b]}" for b in order if counter[b]]
        for title, counter in (("families", self.families), ("dtypes", self.dtypes),
                               ("ops (programs using each)", self.ops)):
            lines.append(f"{title}: " + ", ".join(f"{k} {v}" for k, v in counter.most_common()))
        return "\n".join(lines)


def stats_of(progs: Iterable[Program]) -> Stats:
    out = Stats()
    for p in progs:
        out.add(p)
    return out
