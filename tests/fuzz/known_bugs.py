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
from .program import Program

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


# Every bug the fuzzer found in our code is fixed; add an entry only while a found bug's fix
# is under way, or (as below) where the oracle itself is wrong.
KNOWN_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        "tvm-scatter-elements-narrow",
        "TVM's default build, the oracle, misplaces scatter_elements updates whose indices are "
        "narrower than the data off the scatter axis; ours scatters into the region they cover, "
        "checked against ONNX's semantics in numpy by tests/relax_passes/test_normalize_indices.py "
        "and tests/regressions/test_fuzz_add228d87d.py",
        lambda prog: any(s.op == "scatter_elements" for s in prog.steps),
        frozenset({"values"}),
        "TVM default build",
    ),
)


def known_bug(prog: Program, failure: FuzzFailure,
              bugs: tuple[KnownBug, ...] = KNOWN_BUGS) -> KnownBug | None:
    """The known bug of ``bugs`` this failure of ``prog`` is, if any."""
    return next((bug for bug in bugs if bug.matches(prog, failure)), None)
