"""WrappingIntegers: integer arithmetic on tensor values in CPU kernels wraps around, as each
op of the graph does on its own.

A Relax ``add``, ``subtract`` or ``multiply`` of integers wraps on overflow (numpy and
PyTorch too: ``uint8(255) + 1`` is 0, ``int32`` max ``+ 1`` is its min). Once a schedule
inlines such an op into its consumer, two parts of TVM's CPU build take integer
arithmetic to be the integers':

* the TIR simplifier rewrites ``x < x + 1`` to true, and for an unsigned ``x`` it aborts
  on the way (``Minuend's value is 0U``: the ``(x + 1) > x`` of a fused add and compare);
* code generation marks every 32- and 64-bit add, subtract and multiply ``nsw`` (signed) or
  ``nuw`` (unsigned), for which LLVM may assume no overflow: it folded ``(x + 1) > x`` to
  true for ``int32`` and ``int64``, and ``x - 1 < x`` for unsigned ones.

``WrappingIntegers`` runs after the schedules (``aicf_tvm.driver.pipeline.schedule``, and
the tuning build), on kernels for LLVM targets. It replaces each integer ``+ - *`` that
reads a tensor (its operands hold a load outside the load's indices) by a call of an op of
our own (``aicf.wrap_add`` ...) that the simplifier does not look into; ``LowerIntrin``, the
last pass before code generation, turns it back into arithmetic that wraps: the plain
operation below 32 bits (emitted without ``nsw``/``nuw``), and at 32 and 64 bits the
operation on operands widened to twice the bits (signed for ``+ -``, of the operands'
signedness for ``*``), where it cannot overflow, truncated back.

Sound: truncation keeps the low bits, and the low ``b`` bits of an exact sum, difference or
product are the wrapped ``b``-bit result, so each call computes what the op computes. Index
arithmetic (loop variables, shapes, constants) is left to the simplifier: its operands are
extents and positions, which do not overflow.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import ir, tirx
from tvm.ir import Expr
from tvm.target import Target

from .llvm_pass import llvm_prim_func_pass, register_sealed_op

_NODES = {tirx.Add: "add", tirx.Sub: "sub", tirx.Mul: "mul"}
_OPS = {name: f"aicf.wrap_{name}" for name in _NODES.values()}


def _scalar_and_lanes(ty: object) -> tuple[str, str]:
    """``("int32", "x16")`` for ``int32x16``, ``("uint8", "")`` for ``uint8``."""
    text = str(ty)
    base, _, lanes = text.partition("x")
    return base, f"x{lanes}" if lanes else ""


def _is_integer(expr: Expr) -> bool:
    return _scalar_and_lanes(expr.ty)[0].startswith(("int", "uint"))


def _lower(name: str):
    node = {v: k for k, v in _NODES.items()}[name]

    def lower(call: tirx.Call) -> Expr:
        a, b = call.args
        base, lanes = _scalar_and_lanes(call.ty)
        unsigned = base.startswith("uint")
        bits = int(base[4:] if unsigned else base[3:])
        if bits < 32:  # emitted without nsw/nuw: wraps as it is
            return node(a, b)
        signed = "uint" if unsigned and name == "mul" else "int"
        wide = f"{signed}{2 * bits}{lanes}"
        return tirx.Cast(f"{base}{lanes}", node(tirx.Cast(wide, a), tirx.Cast(wide, b)))

    return lower


def _register() -> None:
    for name, op_name in _OPS.items():
        register_sealed_op(op_name, _lower(name))


_register()


def _reads_tensor(expr: Expr) -> bool:
    """Whether ``expr`` holds a load outside the indices of its loads (a value, not an
    index computed from loop variables and shapes)."""
    found = [False]

    def visit(node: Expr) -> None:
        found[0] = found[0] or isinstance(node, ir.TensorLoad)

    tvm_ffi.structural_walk(expr, [(ir.TensorLoad, visit)])
    return found[0]


def wrapping_integers(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with its integer arithmetic on tensor values sealed (module docstring)."""
    def binary(node: Expr) -> Expr:
        if not _is_integer(node) or not (_reads_tensor(node.a) or _reads_tensor(node.b)):
            return node
        return tirx.call_intrin(node.ty, _OPS[_NODES[type(node)]], node.a, node.b)

    return tvm_ffi.structural_map(func, [(t, binary) for t in _NODES])


def WrappingIntegers(target: Target | None = None) -> tvm.transform.Pass:
    """PrimFunc pass applying ``wrapping_integers`` to the PrimFuncs compiled for LLVM."""
    return llvm_prim_func_pass(wrapping_integers, target, "WrappingIntegers")


__all__ = ["WrappingIntegers", "wrapping_integers"]
