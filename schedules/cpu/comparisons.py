"""IEEE 754 float comparisons in CPU kernels, whatever a schedule inlined.

TVM 0.27 gets two things wrong about float comparisons with NaN (checked on LLVM): code
generation lowers ``a != b`` to LLVM's ordered ``fcmp one``, false when an operand is NaN
(IEEE 754, C and numpy: true), and the simplifier rewrites a negated comparison into the
opposite one (``!(a == b)`` -> ``a != b``, ``!(a < b)`` -> ``b <= a``), false for NaN
where the negation is true.  A graph's ``logical_not(equal(x, y))`` is exact as two
blocks; once a schedule inlines one into the other, a NaN compares like a match.  SDPA's
all-masked-row guard, ``not(any(not(scores == -inf)))``, then took a row of NaN scores for
a fully masked row and gave 0 where the graph gives NaN.

``NaNExactComparisons`` runs after scheduling (with ``VectorizeMath``) and spells the NaN
case out, so nothing later can drop it: a float ``a != b`` and ``!(a == b)`` become
``a != b || isnan(a) || isnan(b)``, ``!(a < b)`` becomes ``a >= b || isnan(a) ||
isnan(b)`` (likewise for ``<=``, ``>``, ``>=``); ``!(a != b)`` is then ``a == b``.
Ordered comparisons (``==``, ``<``, ...) are already false for NaN and stay.  ``isnan``
is a call the simplifier does not look into; it lowers to an unordered compare.  The
attention and reduction rules inline such chains; elementwise fusion can too.
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir import Expr
from tvm.target import Target

from .llvm_pass import llvm_prim_func_pass

# The ordered comparison that is true exactly where the key's is false, NaN aside.
_COMPLEMENT = {
    tirx.EQ: tirx.NE, tirx.LT: tirx.GE, tirx.LE: tirx.GT, tirx.GT: tirx.LE, tirx.GE: tirx.LT,
}


def _is_float(expr: Expr) -> bool:
    return str(expr.ty).startswith(("float", "bfloat"))


def _or_unordered(test: Expr, a: Expr, b: Expr) -> Expr:
    """``test``, or true when ``a`` or ``b`` is NaN (an immediate other than NaN never is)."""
    for x in (a, b):
        if not (isinstance(x, tirx.FloatImm) and not math.isnan(x.value)):
            test = tirx.Or(test, tirx.isnan(x))
    return test


def _negation(node: tirx.Not) -> Expr:
    """``!(a cmp b)`` of floats as its NaN-exact complement."""
    cmp = node.a
    if type(cmp) in _COMPLEMENT and _is_float(cmp.a):
        return _or_unordered(_COMPLEMENT[type(cmp)](cmp.a, cmp.b), cmp.a, cmp.b)
    return node


def _not_equal(node: tirx.NE) -> Expr:
    return _or_unordered(node, node.a, node.b) if _is_float(node.a) else node


def nan_exact_comparisons(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with its float ``!=`` and negated float comparisons NaN-exact (module
    docstring).  The map runs children first and does not revisit what a callback built, so
    the ``!=`` of a rewritten negation is not rewritten again; ``!(a != b)`` becomes
    ``!(a != b || isnan(a) || isnan(b))``, which is ``a == b``."""
    return tvm_ffi.structural_map(func, [(tirx.Not, _negation), (tirx.NE, _not_equal)])


def NaNExactComparisons(target: Target | None = None) -> tvm.transform.Pass:
    """PrimFunc pass applying ``nan_exact_comparisons`` to the PrimFuncs compiled for an LLVM
    target (the PrimFunc's ``target`` attr, else ``target``, else ``with target:``)."""
    return llvm_prim_func_pass(nan_exact_comparisons, target, "NaNExactComparisons")
