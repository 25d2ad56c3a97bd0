"""Shape requirements: the relations of input dims a function's ops assume, checked at the call.

The kernels are built for the types Relax infers, and those assume relations of dims it
cannot prove (``relax_passes.shape_rules``: a matmul's contraction dims equal, a slice
assumed in bounds within its input, ...). Called with dims that break one, a kernel reads
past its buffers and returns garbage or crashes: ``from_onnx(shapes={"x": ["a", "b"]})``
of a MatMul by a 16-row weight read past the weight at ``b = 40`` and segfaulted at
``b = 4,000,000``. ``requirements_of`` collects, over every op call of a function, the
conditions of ``shape_rules`` as ``aicf_tvm.runtime.call_checks.Requirement`` values over the names
of the input dims; the compiled model checks them in Python before any kernel runs, and an
exported library carries them in its metadata.

A condition proven under the dims' bounds (every dim ``>= 0``, the ``tir_var_*_bound``
attrs) is dropped; one proven false is an ``UnsupportedModelError`` at compile time (no
call could run); one over a symbolic var that no input shape binds (a size computed from
data) cannot be checked before the call and is left out. Runs on op-level Relax: the
function as imported (``CompiledModel`` derives them from the ``main`` it compiled).

Sound: a call whose dims meet every condition is one for which each op's inferred type is
its result type, so the kernels read and write within their buffers; every other call is
refused before anything runs.
"""

from __future__ import annotations

import json

import tvm
from tvm import relax, sym, tirx

from aicf_tvm.core.errors import UnsupportedModelError
from aicf_tvm.runtime.call_checks import DimExpr, Requirement, names_in, render

from .bound_shapes import bounds_of
from .shape_rules import conditions, type_shape

_INFIX = {tirx.Add: "+", tirx.Sub: "-", tirx.Mul: "*", tirx.FloorDiv: "//", tirx.FloorMod: "%",
          tirx.Min: "min", tirx.Max: "max", tirx.EQ: "==", tirx.NE: "!=", tirx.LT: "<",
          tirx.LE: "<=", tirx.And: "and", tirx.Or: "or"}


def to_json(expr: tvm.ir.Expr) -> DimExpr | None:
    """``expr`` as a ``call_checks`` dim expression, or None for a form it has none of."""
    if isinstance(expr, tirx.IntImm):
        return int(expr.value)
    if isinstance(expr, tirx.Var):
        return expr.name
    if isinstance(expr, tirx.Cast) and str(expr.ty).startswith(("int", "bool")):
        return to_json(expr.value)
    if isinstance(expr, (tirx.GT, tirx.GE)):  # as < and <= with the operands swapped
        op, args = "<" if isinstance(expr, tirx.GT) else "<=", [expr.b, expr.a]
    elif isinstance(expr, tirx.Not):
        op, args = "not", [expr.a]
    elif isinstance(expr, tirx.Select):
        op, args = "select", [expr.condition, expr.true_value, expr.false_value]
    elif type(expr) in _INFIX:
        op, args = _INFIX[type(expr)], [expr.a, expr.b]
    else:
        return None
    parts = [to_json(a) for a in args]
    return None if any(p is None for p in parts) else [op, *parts]


def _text(dim: tvm.ir.Expr) -> str:
    expr = to_json(dim)
    return render(expr) if expr is not None else str(dim)


def _operand(expr: relax.Expr, params: dict) -> str:
    if isinstance(expr, relax.Var) and expr in params:
        return f"input {params[expr]}"
    shape = type_shape(expr.ty)
    dims = ", ".join(_text(d) for d in shape) if shape is not None else "?"
    what = "a constant" if isinstance(expr, tvm.ir.Constant) else "a"
    return f"{what} {expr.ty.dtype} [{dims}] tensor"


def describe(call: relax.Call, params: dict) -> str:
    """``matmul of input x and a constant float32 [16, 8] tensor``: the op as messages name
    it (``params``: the function's inputs and their names)."""
    tensors = [t for a in call.args for t in (a.fields if isinstance(a, relax.Tuple) else [a])
               if isinstance(getattr(t, "ty", None), relax.TensorType)]
    names = [_operand(t, params) for t in tensors] or ["its operands"]
    joined = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"{call.op.name.removeprefix('relax.')} of {joined}"


def input_dims(func: relax.Function) -> set[str]:
    """The names of the symbolic dims the inputs' shapes bind (a whole extent each)."""
    out: set[str] = set()

    def visit(ty: relax.Type) -> None:
        out.update(d.name for d in type_shape(ty) or [] if isinstance(d, tirx.Var))
        for field in getattr(ty, "fields", None) or []:
            visit(field)

    for param in func.params:
        visit(param.ty)
    return out


def _analyzer(func: relax.Function) -> sym.Analyzer:
    """Every symbolic dim at least 0 and within its ``tir_var_*_bound``."""
    analyzer = sym.Analyzer()
    bounds = bounds_of(func)
    for var in relax.analysis.defined_symbolic_vars(func):
        lo, hi = bounds.get(var.name, (None, None))
        top = sym.ConstIntBound.POS_INF if hi is None else hi
        analyzer.update(var, sym.ConstIntBound(max(0, lo or 0), top), True)
    return analyzer


def requirements_of(func: relax.Function) -> list[Requirement]:
    """What the op calls of ``func`` require of its input dims and is not proven (module
    docstring), each once; ``UnsupportedModelError`` for one no input can meet."""
    analyzer, dims = _analyzer(func), input_dims(func)
    params = {p: p.name for p in func.params}
    calls: list[relax.Call] = []
    relax.analysis.post_order_visit(
        func.body, lambda e: calls.append(e) if isinstance(e, relax.Call)
        and isinstance(e.op, tvm.ir.Op) else None)
    out: dict[str, Requirement] = {}
    for call in calls:
        for cond, role in conditions(call):
            if analyzer.can_prove(cond):
                continue
            if analyzer.can_prove(tirx.Not(cond)):
                raise UnsupportedModelError(
                    f"{describe(call, params)} requires {_text(analyzer.simplify(cond))} "
                    f"({role}), which no input meets; check the model's input shapes (and the "
                    f"dims given with --shape or --dim)")
            expr = to_json(analyzer.simplify(cond))
            if expr is None or not set(names_in(expr)) <= dims:
                continue  # not a relation of input dims: nothing to check before the call
            out.setdefault(json.dumps(expr), Requirement(expr, describe(call, params), role))
    return list(out.values())


__all__ = ["describe", "input_dims", "requirements_of", "to_json"]
