"""PrecomputeBoundedTables: float tables of ``arange(0, n)`` computed at compile time up to
n's bound, sliced per call.

A static build folds the rotary tables of a decoder (``cos``/``sin`` of ``positions x
inverse frequencies``) into constants; with a symbolic ``seq`` the positions are
``arange(0, seq)`` and the tables cost four kernels per call (arange, the product, cos,
sin; the transcendentals through libm), each call recomputing the same values.  When
the frontend bounds the dim (``tir_var_upper_bound``, ``Dim("seq", max=512)``), this pass
evaluates such a table once at the bound (``FoldConstant``, what a static build runs on
it) and replaces it by ``strided_slice(table, 0, seq)`` on each of its symbolic axes.

A *table* is a value computed only from constants and ``arange(0, n, 1)`` of a bounded
symbolic ``n``, through elementwise and broadcasting ops (the kind registry's
categories), ``astype``, ``expand_dims`` and ``concat`` on a static axis, with every
symbolic dim of every shape one such ``n``.  The pass replaces the tables that are float
and feed something that is not a table (or the function's result), and contain a call
other than arange, views and casts; integer and bool index tensors stay (they are cheap,
fuse, and ``NormalizeIndices`` proves their range).  Runs on op-level Relax in
``normalize``, after ``NormalizeIndices``.

Sound: an element of such a value at index ``i < n`` on its symbolic axis depends only on
element ``i`` of ``arange(0, n)``, which is ``i`` for every ``n > i``: evaluated at the
bound and sliced to ``n``, the table holds the same elements (the same kernels compute
them, at compile time, as in the static build), for every ``n`` the bound admits.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from aicf_tvm.core.kinds.registry import BROADCAST, ELEMENTWISE, rule_for

from .bound_shapes import bounds_of
from .fast_fold import fold_bindings
from .ieee_fold import scalars_as_buffers

# Elements a precomputed table may hold (a 512 x 128 float32 table is 256 KiB).
MAX_TABLE_ELEMENTS = 1 << 20

_VIEWS = frozenset({"relax.astype", "relax.expand_dims"})


def _shape(expr: relax.Expr) -> list | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return list(ty.shape.values)


class TableFinder:
    """Which bindings of a function compute tables (module docstring), in one pass over
    its dataflow bindings in order."""

    def __init__(self, bounds: dict[str, int]) -> None:
        self.bounds = bounds
        self.tables: dict[relax.Var, bool] = {}  # var -> whether its table computes something
        self.bindings: dict[relax.Var, relax.VarBinding] = {}

    def fits(self, expr: relax.Expr) -> bool:
        """Every dim static or a bounded var, and the table small enough at the bounds."""
        shape = _shape(expr)
        if shape is None:
            return False
        size = 1
        for dim in shape:
            if isinstance(dim, tirx.IntImm):
                size *= int(dim.value)
            elif isinstance(dim, tirx.Var) and dim.name in self.bounds:
                size *= self.bounds[dim.name]
            else:
                return False
        return size <= MAX_TABLE_ELEMENTS

    def classify(self, value: relax.Expr) -> bool | None:
        """None: not a table; else whether the table computes something beyond views."""
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return None
        name = value.op.name
        if name == "relax.arange":
            start, end, step = value.args
            is_positions = (_is_int(start, 0) and _is_int(step, 1) and isinstance(end, tirx.Var)
                            and end.name in self.bounds)
            return False if is_positions else None
        if name == "relax.concat":
            shape = _shape(value)
            if shape is None or not isinstance(shape[int(value.attrs.axis) % len(shape)], tirx.IntImm):
                return None
            tensors = list(value.args[0].fields)
        elif name in _VIEWS or rule_for(name).category in (ELEMENTWISE, BROADCAST):
            tensors = list(value.args)
        else:
            return None
        computed = name not in _VIEWS and name != "relax.concat"
        for arg in tensors:
            if isinstance(arg, tvm.ir.Constant):
                continue
            if not isinstance(arg, relax.Var) or arg not in self.tables:
                return None
            computed = computed or self.tables[arg]
        return computed

    def run(self, func: relax.Function) -> list[relax.Var]:
        """The tables to precompute: float, computing something, used by a non-table."""
        used: set = set()
        for block in func.body.blocks:
            for binding in block.bindings:
                kind = self.classify(binding.value) if isinstance(binding, relax.VarBinding) else None
                if kind is not None and self.fits(binding.value):
                    self.tables[binding.var] = kind
                    self.bindings[binding.var] = binding
                else:
                    used.update(relax.analysis.free_vars(binding.value))
        used.update(relax.analysis.free_vars(func.body.body))
        return [v for v, computed in self.tables.items()
                if computed and v in used and str(v.ty.dtype).startswith(("float", "bfloat"))
                and any(isinstance(d, tirx.Var) for d in _shape(v))]

    def closure(self, var: relax.Var) -> list[relax.VarBinding]:
        """The table bindings ``var`` depends on, itself last, in program order."""
        out: list[relax.VarBinding] = []
        seen: set = set()

        def visit(v: relax.Var) -> None:
            if v in seen or v not in self.bindings:
                return
            seen.add(v)
            for arg in relax.analysis.free_vars(self.bindings[v].value):
                visit(arg)
            out.append(self.bindings[v])

        visit(var)
        return out


def _is_int(expr: tvm.ir.Expr, value: int) -> bool:
    return isinstance(expr, tirx.IntImm) and int(expr.value) == value


def evaluate_at_bounds(bindings: list[relax.VarBinding], bounds: dict[str, int]) -> tvm.ir.Constant | None:
    """The last binding's value with every bounded dim at its bound, folded to a constant
    by ``LegalizeOps`` + ``FoldConstant`` (None when it does not fold)."""
    out = relax.Var(bindings[-1].var.name, bindings[-1].var.ty)  # the block's output: no DataflowVar
    body = relax.SeqExpr([relax.DataflowBlock([*bindings[:-1], relax.VarBinding(out, bindings[-1].value)])], out)
    dims = list({v.name: v for v in _symbolic_vars(bindings)}.values())
    # a shape parameter defines the dims, so that they can be bound
    func = relax.Function([relax.Var("dims", relax.ShapeType(dims))], body, out.ty)
    func = func.bind_symbolic_vars({v: tirx.const(bounds[v.name], v.ty.dtype) for v in dims})
    with scalars_as_buffers():  # IEEE float arithmetic, not TVM's folds of immediates
        legal = relax.transform.LegalizeOps()(tvm.IRModule({"main": func}))
        folded = relax.transform.FoldConstant()(legal)["main"]
    result = folded.body.body if isinstance(folded.body, relax.SeqExpr) else folded.body
    if isinstance(result, relax.Var):
        for block in folded.body.blocks:
            for binding in block.bindings:
                if binding.var.same_as(result):
                    result = binding.value
    return result if isinstance(result, tvm.ir.Constant) else None


def evaluate_static(bindings: list[relax.VarBinding], wanted: list[relax.Var]) -> dict:
    """Each var of ``wanted`` (bound in ``bindings``, which read constants only and have
    static shapes, in program order) to its value folded to a constant, or None; all in
    one ``LegalizeOps`` + ``FoldConstant``, so a kernel that several of them need is built
    once (FoldConstant keeps its builds by structure for one run). The same values as
    ``evaluate_at_bounds`` of each one's chain: a binding's fold reads only its inputs."""
    def fold(mod: tvm.IRModule) -> tvm.IRModule:
        with scalars_as_buffers():  # IEEE float arithmetic, not TVM's folds of immediates
            return relax.transform.FoldConstant()(relax.transform.LegalizeOps()(mod))

    values = fold_bindings(fold, bindings, [], tvm.IRModule())
    return {v: values.get(v) for v in wanted}


def _symbolic_vars(bindings: list[relax.VarBinding]) -> list[tirx.Var]:
    found = []
    for b in bindings:
        found += [d for d in (_shape(b.var) or []) if isinstance(d, tirx.Var)]
    return found


@mutator
class _Slicer(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, tables: dict) -> None:
        super().__init__(mod)
        self.tables = tables  # var -> its replacement expression

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var not in self.tables:
            super().visit_var_binding_(binding)
            return
        value = self.tables[binding.var]
        emit = self.builder_.emit if isinstance(binding.var, relax.DataflowVar) else self.builder_.emit_output
        self.set_var_remap(binding.var, emit(value, binding.var.name))


def _sliced(table: tvm.ir.Constant, var: relax.Var) -> relax.Expr:
    """``table`` cut back to ``var``'s symbolic dims."""
    shape = _shape(var)
    axes = [k for k, d in enumerate(shape) if isinstance(d, tirx.Var)]
    return relax.op.strided_slice(table, axes, [0] * len(axes), [shape[k] for k in axes], assume_inbound=True)


@relax.transform.function_pass(opt_level=0, name="PrecomputeBoundedTables")
class PrecomputeBoundedTables:
    """Fold float tables of bounded ``arange`` positions to constants (module docstring)."""

    def transform_function(self, func: relax.Function, mod: tvm.IRModule,
                           ctx: tvm.transform.PassContext) -> relax.Function:
        bounds = {name: high for name, (_, high) in bounds_of(func).items() if high is not None}
        if not bounds or not isinstance(func.body, relax.SeqExpr):
            return func
        finder = TableFinder(bounds)
        replaced = {}
        for var in finder.run(func):
            table = evaluate_at_bounds(finder.closure(var), bounds)
            if table is not None:
                replaced[var] = _sliced(table, var)
        # the bindings the tables replace are dead now: normalize's DeadCodeElimination
        return _Slicer(mod, replaced).visit_expr(func) if replaced else func
