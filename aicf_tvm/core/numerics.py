"""Numeric levels: how far a kernel may depart from the graph's own float arithmetic
(docs/numerics.md, "Numeric levels").

* ``exact`` (the default): what the graph's op order computes; each transcendental within
  0.5001 ulp (``schedules.cpu.vector_math``), every sum in the order the legalized
  TensorIR writes it.
* ``relaxed``: exp, sigmoid and tanh evaluated in float32 (``schedules.cpu.relaxed_math``,
  within ``ULP_BOUNDS`` there), and the row sums of softmax and attention added in one
  partial sum per vector lane, then the lanes in order (a blocked sum, whose error bound
  is below the serial sum's).

A user asks for ``relaxed`` with ``CompileOptions(numerics="relaxed")`` (``compile(...,
numerics=...)``, ``aicf compile --numerics``); ``relax_passes.numeric_levels`` puts each
Emit whose kernel it changes at that level: its math tag joins ``approx:relaxed``, the
function carries ``NUMERICS_ATTR`` (copied onto its kernel by ``LowerEmits``), and the
report lists it as an ``approximate:numerics_relaxed`` decision.  The schedule rules and
``VectorizeMath`` read the level from the kernel with ``is_relaxed``.
"""

from __future__ import annotations

from typing import Any

EXACT, RELAXED = "exact", "relaxed"
NUMERIC_LEVELS = (EXACT, RELAXED)
NUMERICS_ATTR = "aicf.numerics"  # on an Emit function and its kernel: the level, when not exact
RELAXED_MATH = "approx:relaxed"  # the math tag a relaxed Emit joins


def is_relaxed(func: Any) -> bool:
    """Whether ``func`` (a Relax function or PrimFunc) is at the ``relaxed`` level."""
    attrs = getattr(func, "attrs", None)
    return attrs is not None and str(attrs.get(NUMERICS_ATTR, EXACT)) == RELAXED


__all__ = ["EXACT", "NUMERICS_ATTR", "NUMERIC_LEVELS", "RELAXED", "RELAXED_MATH", "is_relaxed"]
