"""Bugs the fuzzer finds that are known and being fixed: matched failures are skipped.

A ``KnownBug`` matches a failure when the program has the construct that triggers it
(``has``) and the failure looks like it (its ``FuzzFailure`` kind, and the message
pattern if one is given). Both must hold, so that a new bug in a program that merely
contains, say, a batch_norm still fails. Delete an entry when its fix lands: the
examples it skipped then run again.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .check import FuzzFailure
from .program import Program, Step

WRONG_VALUES = frozenset({"values", "signed-zero", "numpy"})


@dataclass(frozen=True)
class KnownBug:
    name: str
    what: str
    has: Callable[[Program], bool]
    kinds: frozenset[str]
    message: str = ""  # a regex the failure's message must contain ("" = any)

    def matches(self, prog: Program, failure: FuzzFailure) -> bool:
        return failure.kind in self.kinds and bool(re.search(self.message, failure.message)) and self.has(prog)


def _steps(prog: Program, op: str) -> list[Step]:
    return [s for s in prog.steps if s.op == op]


def _producer(prog: Program, value: int) -> Step | None:
    k = value - len(prog.inputs)
    return prog.steps[k] if k >= 0 else None


def _batch_norm(pred: Callable[[Program, Step], bool]) -> Callable[[Program], bool]:
    return lambda prog: any(pred(prog, s) for s in _steps(prog, "batch_norm"))


def _fill_const(prog: Program, ops: tuple[str, ...], fills: set[str]) -> list[Step]:
    return [s for s in prog.steps if s.op in ops and s.params.get("const", {}).get("fill") in fills]


def _zero_and_negzero(prog: Program) -> bool:
    """One op with a constant 0.0 and the same op with a constant -0.0."""
    fills: dict[str, set] = {}
    for step in prog.steps:
        fill = step.params.get("const", {}).get("fill")
        if fill in ("zero", "negzero"):
            fills.setdefault(step.op, set()).add(fill)
    return any(f == {"zero", "negzero"} for f in fills.values())


def _const_in_two_roles(prog: Program) -> bool:
    """A matmul's constant weight is also the constant of another step (one Relax constant)."""
    specs = [str(sorted(s.params["const"].items())) for s in prog.steps if "const" in s.params]
    weights = [str(sorted(s.params["const"].items())) for s in prog.steps if s.op == "matmul" and "const" in s.params]
    return any(specs.count(w) > 1 for w in weights)


KNOWN_BUGS: tuple[KnownBug, ...] = (
    KnownBug("batch_norm-center-scale", "batch_norm with center=False or scale=False is folded as if both were on",
             _batch_norm(lambda p, s: not s.params["center"] or not s.params["scale"]), WRONG_VALUES),
    KnownBug("batch_norm-training", "batch_norm training=True is computed with the moving stats",
             _batch_norm(lambda p, s: s.params["training"]), WRONG_VALUES),
    KnownBug("batch_norm-fold-dtype", "the batch_norm fold on float16 adds a float32 epsilon to float16 stats",
             _batch_norm(lambda p, s: s.params["gamma"]["dtype"] == "float16"), frozenset({"error"}), "datatype"),
    KnownBug("sink-reshapes-prelu", "SinkReshapes moves a prelu above a reshape and keeps its axis",
             lambda prog: any((_producer(prog, s.args[0]) or Step("", ())).op == "reshape"
                              for s in _steps(prog, "prelu")), frozenset({"error"}), "prelu"),
    KnownBug("signed-zero-add", "x + 0.0 and x - (-0.0) are eliminated, but -0.0 + 0.0 is +0.0",
             lambda prog: bool(_fill_const(prog, ("add", "subtract"), {"zero", "negzero"})),
             frozenset({"signed-zero"}),
             r"ours np\.float\d+\(-0\.0\), expected np\.float\d+\(0\.0\)"),
    KnownBug("negzero-kernel-reuse", "an op with the constant -0.0 reuses the kernel of the same op with 0.0 "
             "(max, min, multiply)", _zero_and_negzero, frozenset({"signed-zero"})),
    KnownBug("divide-by-folded-zero", "1 / (x * 0.0): the divisor folds to 0 and TVM's simplifier fails "
             "('Divide by zero'), aborting the process when raised where it cannot propagate",
             lambda prog: bool(_fill_const(prog, ("multiply",), {"zero", "negzero"}))
             and any(s.op in ("reciprocal", "div") for s in prog.steps), frozenset({"crash", "error"}),
             "terminate called|Divide by zero"),
    KnownBug("prepack-shared-weight", "a prepacked weight that is also used elsewhere leaves a dangling buffer",
             _const_in_two_roles, frozenset({"error"}), "used before its definition"),
    KnownBug("scatter-fused-producer", "a scatter fused with its producer gets inconsistent buffers",
             lambda prog: any(_producer(prog, s.args[0]) is not None for s in prog.steps
                              if s.op in ("scatter_elements", "scatter_nd")), frozenset({"error"}),
             "Inconsistent buffers"),
    KnownBug("zero-size-input", "a zero-size input fails the stride check",
             lambda prog: any(0 in shape for shape, _ in prog.inputs), frozenset({"error"}), "strides|compact array"),
    KnownBug("nested-tuple-output", "a nested tuple output raises AttributeError when the outputs are read",
             lambda prog: any(not isinstance(o, int) for o in prog.outputs), frozenset({"error"}), "AttributeError"),
)


def known_bug(prog: Program, failure: FuzzFailure) -> KnownBug | None:
    """The known bug this failure of ``prog`` is, if any."""
    return next((bug for bug in KNOWN_BUGS if bug.matches(prog, failure)), None)
