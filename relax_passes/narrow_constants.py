"""Constant folding that leaves a narrow weight narrow.

A weight stored in fewer bits than it computes in (an int8 weight read as float32 by an
``astype``: ``compile_causal_lm(weights="int8")``) is the point of storing it so: folding
the cast would store it 4x larger and read 4x the bytes per call. ``keep_narrow`` hides
each integer constant that an ``astype`` widens to float for a ``matmul`` operand (directly
or through ``permute_dims``) as a parameter of its function while a fold runs, and binds
it back after, so the cast stays in the graph and joins the GEMM that reads the weight.
Not folding a cast changes no value: the kernel computes the same exact conversion. Other
casts of constants (a uint8 mask table made float) fold as before.

At import (``dequantized=True``) every ``dequantize`` of an integer constant (a QDQ
model's weights and biases) is kept the same way, so ``relax_passes.integer_qdq`` still
sees the integers; the pipeline's later folds fold what that pass leaves.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import relax

from .fast_fold import fold_constant_part, fold_in_numpy

_ASTYPE = tvm.ir.Op.get("relax.astype")
_HIDDEN = "aicf_narrow_"


def _bits(dtype: str) -> int:
    return tvm.runtime.DataType(dtype).bits


def widens(call: relax.Expr) -> bool:
    """``call`` casts a constant to a wider dtype."""
    if not (isinstance(call, relax.Call) and call.op.same_as(_ASTYPE) and isinstance(call.args[0], tvm.ir.Constant)):
        return False
    src = str(call.args[0].ty.dtype)
    return _bits(call.attrs.dtype) > _bits(src) and src.startswith(("int", "uint"))


_DEQUANTIZE = tvm.ir.Op.get("relax.dequantize")


def dequantizes_constant(call: relax.Expr) -> bool:
    """``call`` dequantizes an integer constant."""
    return (isinstance(call, relax.Call) and call.op.same_as(_DEQUANTIZE) and isinstance(call.args[0], tvm.ir.Constant)
            and str(call.args[0].ty.dtype).startswith(("int", "uint")))


_MATMUL = tvm.ir.Op.get("relax.matmul")
_PERMUTE = tvm.ir.Op.get("relax.permute_dims")


def _weight_casts(func: relax.Function) -> list[relax.Call]:
    """The widening casts (``widens``) whose value is a ``matmul`` operand, possibly
    through ``permute_dims``."""
    bindings = [b for blk in getattr(func.body, "blocks", []) for b in blk.bindings]
    operands: set = set()
    found = []
    for b in reversed(bindings):
        value = b.value
        if not isinstance(value, relax.Call):
            continue
        if value.op.same_as(_MATMUL):
            operands.update(a for a in value.args if isinstance(a, relax.Var))
        elif b.var in operands and value.op.same_as(_PERMUTE) and isinstance(value.args[0], relax.Var):
            operands.add(value.args[0])
        elif b.var in operands and widens(value):
            found.append(value)
    return found


@relax.expr_functor.mutator
class _Hide(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, casts: list[relax.Call]) -> None:
        super().__init__(mod)
        self.casts = casts
        self.hidden: dict[relax.Var, tvm.ir.Constant] = {}

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        if any(call.same_as(c) for c in self.casts):
            const = call.args[0]
            var = relax.Var(f"{_HIDDEN}{len(self.hidden)}", relax.TensorType(const.ty.shape, const.ty.dtype))
            self.hidden[var] = const
            return relax.Call(call.op, [var, *call.args[1:]], call.attrs, call.ty_args)
        return super().visit_call_(call)


def _dequantized(func: relax.Function) -> list[relax.Call]:
    return [b.value for blk in getattr(func.body, "blocks", []) for b in blk.bindings if dequantizes_constant(b.value)]


def keep_narrow(fold: Callable[[tvm.IRModule], tvm.IRModule], mod: tvm.IRModule,
                dequantized: bool = False) -> tvm.IRModule:
    """``fold(mod)`` with every widened weight (``_weight_casts``; with ``dequantized``
    also every dequantized integer constant) left unfolded, run on the compile-time part
    of each function only, the transposes and reshapes of constants folded first in
    numpy (``fast_fold``)."""
    mod = fold_in_numpy(mod)
    hidden: dict[str, dict[relax.Var, tvm.ir.Constant]] = {}
    staged = tvm.IRModule(mod.functions, attrs=mod.attrs)
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        casts = _weight_casts(func) + (_dequantized(func) if dequantized else [])
        if not casts:
            continue
        hider = _Hide(mod, casts)
        body = hider.visit_expr(func.body)
        if hider.hidden:
            hidden[gv.name_hint] = hider.hidden
            staged[gv] = relax.Function([*func.params, *hider.hidden], body, func.ret_ty,
                                        func.is_pure, func.attrs, func.span)
    if not hidden:
        return fold_constant_part(fold, mod)
    out = fold_constant_part(fold, staged)
    for name, consts in hidden.items():
        func = out[name]
        params = func.params[len(func.params) - len(consts):]
        out[name] = func.bind_params(dict(zip(params, consts.values())))
    return out


__all__ = ["dequantizes_constant", "keep_narrow", "widens"]
