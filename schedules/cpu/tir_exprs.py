"""Small TIR expression helpers the math expansions share (``vector_math``, ``relaxed_math``)."""

from __future__ import annotations

from collections.abc import Callable

from tvm import tirx
from tvm.ir import Expr


def let(value: Expr, body: Callable[[tirx.Var], Expr], name: str) -> Expr:
    """``body(v)`` with ``v`` bound to ``value`` once (the expression is used several times)."""
    var = tirx.Var(name, value.ty)
    return tirx.Let(var, value, body(var))


def nan_through(x: Expr, result: Expr) -> Expr:
    """``result``, or ``x`` itself when ``x`` is NaN (the clamps would hide it)."""
    return tirx.Select(tirx.isnan(x), x, result)


__all__ = ["let", "nan_through"]
