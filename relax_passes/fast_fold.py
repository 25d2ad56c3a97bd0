"""``FoldConstant``'s result, for less: the data movement of constants in numpy, and
the fold run on the part of each function that is computable at compile time.

``FoldConstant`` legalizes every call of a module on its way (a BERT-base: over 1000
reshapes of activations), then folds a call of constants by building its kernel with
LLVM and running it. The pipeline folds several times, some of them on a module whose
only foldable calls are a few weight packings, and importers transpose every linear
weight (72 ``permute_dims`` of constants in a BERT-base).

* ``fold_in_numpy``: a transpose or a reshape of a constant is a copy of its elements in
  another order, which numpy does exactly: the constants it makes are the ones
  ``FoldConstant`` would make, element for element. Only dtypes numpy holds natively,
  only results of the call's static type.
* ``fold_constant_part(fold, mod)``: the bindings of dataflow blocks computable at
  compile time (reading constants only, through earlier such bindings), with static
  types, go into a function of their own that ``fold`` folds; each that became a constant
  replaces its binding in the original, its uses reading the constant as ``FoldConstant``
  leaves them. A ``full_like``/``zeros_like``/``ones_like``/``shape_of`` reads only
  its input's type (a static shape) and ``FoldConstant`` folds it: it goes in with
  its input as a parameter of the part. A binding's fold depends only on the bindings it
  reads, all of which are in that function, so what folds, and to what, is what ``fold``
  on the whole module gives.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax

from aicf_tvm.core.tvm_values import static_shape

_PERMUTE = tvm.ir.Op.get("relax.permute_dims")
_RESHAPE = tvm.ir.Op.get("relax.reshape")
_NUMPY_DTYPES = frozenset({"bool", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
                           "uint16", "uint32", "uint64"})


def _numpy_value(call: relax.Call, args: list[tvm.ir.Constant | None]) -> np.ndarray | None:
    """The value of ``call`` on constant ``args`` when it moves data (a transpose, a
    reshape), computed by numpy; None otherwise or when numpy's result is not of the
    call's static type."""
    if not args or not isinstance(args[0], tvm.ir.Constant) or str(args[0].ty.dtype) not in _NUMPY_DTYPES:
        return None
    if call.op.same_as(_PERMUTE):
        axes = call.attrs.axes
        value = args[0].value.numpy().transpose(None if axes is None else [int(a) for a in axes])
    elif call.op.same_as(_RESHAPE) and isinstance(args[1], relax.ShapeExpr):
        dims = args[1].values
        if not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
            return None
        value = args[0].value.numpy().reshape([int(d) for d in dims])
    else:
        return None
    if static_shape(call.ty) != value.shape or str(value.dtype) != str(call.ty.dtype):
        return None
    return value


@relax.expr_functor.mutator
class _FoldMoves(relax.PyExprMutator):
    def _constant(self, arg: relax.Expr) -> relax.Expr | None:
        """``arg`` as a constant (directly, or a var bound to one here), a shape as it is."""
        if isinstance(arg, (tvm.ir.Constant, relax.ShapeExpr)):
            return arg
        bound = self.lookup_binding(arg) if isinstance(arg, relax.Var) else None
        return bound if isinstance(bound, tvm.ir.Constant) else None

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if isinstance(call.op, tvm.ir.Op) and (call.op.same_as(_PERMUTE) or call.op.same_as(_RESHAPE)):
            value = _numpy_value(call, [self._constant(a) for a in call.args])
            if value is not None:
                return relax.const(np.ascontiguousarray(value), str(call.ty.dtype))
        return call


def _static(binding: relax.VarBinding) -> bool:
    return not relax.analysis.tir_vars_in_type(binding.var.ty) and not relax.analysis.free_symbolic_vars(binding.value)


# ops whose legalization reads only their input's type (a static shape): folded whatever
# the input holds
_SHAPE_ONLY = tuple(tvm.ir.Op.get(f"relax.{name}") for name in ("full_like", "zeros_like", "ones_like", "shape_of"))


def _constant_bindings(func: relax.Function) -> tuple[list[relax.VarBinding], list[relax.Var]]:
    """The dataflow bindings of ``func`` with static types that read only constants and
    earlier ones of the list (those computable at compile time, every parameter a
    run-time input), or that apply a ``_SHAPE_ONLY`` op to a value of static type; and
    those values, not computable themselves (inputs of the part)."""
    kept: list[relax.VarBinding] = []
    inputs: list[relax.Var] = []
    defined: set = set()
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            continue
        for b in block.bindings:
            if not isinstance(b, relax.VarBinding) or not _static(b):
                continue
            free = relax.analysis.free_vars(b.value)
            if not all(v in defined for v in free):
                value = b.value
                if not (isinstance(value, relax.Call) and any(value.op.same_as(op) for op in _SHAPE_ONLY)
                        and len(free) == 1 and free[0].same_as(value.args[0]) and static_shape(free[0].ty) is not None):
                    continue
                inputs.append(free[0])
                defined.add(free[0])
            kept.append(b)
            defined.add(b.var)
    return kept, inputs


def fold_bindings(fold: Callable[[tvm.IRModule], tvm.IRModule], bindings: list[relax.VarBinding],
                  inputs: list[relax.Var], mod: tvm.IRModule) -> dict:
    """``fold`` of ``bindings`` as a function of their own (of ``inputs``; ``mod``'s
    PrimFuncs with it, for the ``call_tir`` sites): each binding's var that folded to a
    constant, to that constant."""
    outs = [relax.Var(f"aicf_folded_{i}", b.var.ty) for i, b in enumerate(bindings)]
    block = relax.DataflowBlock([*bindings, *(relax.VarBinding(o, b.var) for o, b in zip(outs, bindings))])
    body = relax.SeqExpr([block], relax.Tuple(outs))
    func = relax.Function(inputs, body, relax.TupleType([o.ty for o in outs]), True)
    part = tvm.IRModule({g: f for g, f in mod.functions_items() if not isinstance(f, relax.Function)}, attrs=mod.attrs)
    part["aicf_fold_part"] = func
    result = fold(part)["aicf_fold_part"]
    bound = {b.var: b.value for blk in result.body.blocks for b in blk.bindings if isinstance(b, relax.VarBinding)}
    values = {}
    for b, field in zip(bindings, result.body.body.fields):
        while isinstance(field, relax.Var) and field in bound:
            field = bound[field]
        if isinstance(field, tvm.ir.Constant):
            values[b.var] = field
    return values


@relax.expr_functor.mutator
class _Substitute(relax.PyExprMutator):
    """Drops the bindings of ``values``' vars; their uses read the constants."""

    def __init__(self, mod: tvm.IRModule, values: dict) -> None:
        super().__init__(mod)
        self.values = values

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var not in self.values:
            super().visit_var_binding_(binding)

    def visit_var_(self, var: relax.Var) -> relax.Expr:
        return self.values.get(var) or super().visit_var_(var)

    def visit_dataflow_var_(self, var: relax.DataflowVar) -> relax.Expr:
        return self.values.get(var) or super().visit_dataflow_var_(var)


def fold_constant_part(fold: Callable[[tvm.IRModule], tvm.IRModule], mod: tvm.IRModule) -> tvm.IRModule:
    """``fold(mod)``'s folding (``fold``: ``FoldConstant`` or a variant), run on each
    function's compile-time part only (module docstring)."""
    out = None
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        bindings, inputs = _constant_bindings(func)
        values = fold_bindings(fold, bindings, inputs, mod) if bindings else {}
        if values:
            out = out if out is not None else tvm.IRModule(mod.functions, attrs=mod.attrs)
            out[gv] = _Substitute(mod, values).visit_expr(func)
    return mod if out is None else out


def fold_in_numpy(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each transpose or reshape of a constant (including a constant an
    earlier such fold made) replaced by its value computed by numpy."""
    out = tvm.IRModule(mod.functions, attrs=mod.attrs)
    changed = False
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            new = _FoldMoves(mod).visit_expr(func)
            if not new.same_as(func):
                out[gv] = new
                changed = True
    return out if changed else mod


__all__ = ["fold_bindings", "fold_constant_part", "fold_in_numpy"]
