"""ImplicitBroadcasts: drop an explicit broadcast that its consumer makes anyway.

Frontends spell out broadcasts that the consuming op would do by itself: PyTorch's
``matmul`` of a ``[batch, seq, k]`` activation by a ``[k, n]`` weight decomposes, with a
symbolic batch, into ``bmm(x, expand(w, [batch, k, n]))``, and SDPA's all-masked-row guard
is ``where(cond, full_like(p, 0), p)``. With static shapes constant folding turns both into
constants; with a symbolic batch or length they stay kernels that write a tensor of the
full shape every call (a copy of the weight per batch element, a tensor of zeros), and
they sit between ops a fused candidate would cover. This pass replaces such an operand by
what it broadcasts, wherever the consumer is a pointwise op (``is_pointwise``) or a
``matmul`` and its result type stays exactly the same:

* ``broadcast_to(b, s)`` by ``b``;
* ``full_like(x, c)`` of a rank-0 constant ``c`` (of the result's dtype) by ``c``;
* a constant with two or more axes above 1 whose elements all have the same bits by that
  element as a rank-0 constant, whether it is a constant already (what folding made of a
  ``full_like`` or ``zeros``) or what a chain of ops on constants alone computes (SDPA's
  mask from ``arange``, evaluated here by ``LegalizeOps`` and ``FoldConstant``, as the
  pipeline folds it later anyway). Per-channel operands (biases, norm scales) keep their
  shape: the kernels' epilogues take them as they are, and trained ones are not uniform,
  where a random-init model's zero biases are.

The uniform ones cost at every call: PyTorch's SDPA decomposition adds a zero mask
``[1, 1, seq, seq]`` and fills fully masked rows from zeros ``[1, heads, seq, seq]``, so a
ViT-B/16 layer's attention read 2 MB of constant zeros (24 MB of them in the module) for
nothing; with rank-0 operands it reads two scalars.

Sound: pointwise ops and ``matmul``'s batch axes broadcast their operands by NumPy's rules,
and broadcasting composes (broadcasting ``b`` to ``s`` and the result to the output is
broadcasting ``b`` to the output), so when the output shape is unchanged every output
element reads the same operand elements. A uniform constant is the broadcast of its one
element; "the same" is bit for bit, so -0.0 and +0.0, or two NaN payloads, are not one
value. A ``matmul``'s last two axes are not broadcast: the type check refuses a change
there (the shape, or the inference, would differ). The rank-0 operand must then be read
as IEEE arithmetic reads it: TVM's TIR simplifier folds an immediate ``x + 0.0`` into
``x`` (wrong for x = -0.0), so a zero must stay a buffer where it is added, as our
``LowerEmits`` keeps it (``lower_emits.bind_scalar_ports``). Runs on op-level Relax,
before LiftEmits; the broadcasts and chains left unused go with dead-code elimination.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from aicf_tvm.core.kinds.describe import is_pointwise
from aicf_tvm.core.options import CompileOptions, options_or_default

from .bounded_tables import evaluate_at_bounds, evaluate_static

# Elements of the largest constant-only chain evaluated to learn whether it is uniform.
MAX_EVALUATED = 1 << 22


def broadcast_source(value: relax.Expr) -> relax.Expr | None:
    """What a broadcasting binding broadcasts: the source of ``broadcast_to``, the rank-0
    fill constant of a ``full_like`` of the same dtype, else None."""
    if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
        return None
    if value.op.name == "relax.broadcast_to":
        return value.args[0]
    if value.op.name == "relax.full_like":
        fill = value.args[1]
        if isinstance(fill, tvm.ir.Constant) and fill.ty.ndim == 0 and str(fill.ty.dtype) == str(value.ty.dtype):
            return relax.const(np.asarray(fill.value.numpy()), str(fill.ty.dtype))
    return None


def uniform_constant(value: relax.Expr | None) -> tvm.ir.Constant | None:
    """A constant tensor (rank 1 or more) whose elements all have the same bits, as the
    rank-0 constant of that element; else None."""
    if not isinstance(value, tvm.ir.Constant) or not isinstance(value.ty, relax.TensorType) or value.ty.ndim < 1:
        return None
    data = value.value.numpy()
    if data.size == 0:
        return None
    bits = data.reshape(-1).view(f"u{data.dtype.itemsize}") if data.dtype.itemsize in (1, 2, 4, 8) else None
    if bits is None or not (bits == bits[0]).all():
        return None
    return relax.const(data.reshape(-1)[:1].reshape(()), str(value.ty.dtype))


def _on_constants(value: relax.Expr, constant: set) -> bool:
    """Whether ``value`` is a pure op call whose operands are constants, shapes or
    variables of ``constant``."""
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)) \
            or value.op.name.startswith("relax.call_") or not value.op.get_attr("FPurity"):
        return False
    return all(a in constant if isinstance(a, relax.Var)
               else not isinstance(a, relax.Call) and not relax.analysis.free_vars(a) for a in value.args)


def constant_vars(func: relax.Function) -> set:
    """The variables of ``func`` that chains of pure op calls compute from constants alone,
    found in one pass over its bindings in program order (``constant_chain``'s domain)."""
    constant: set = set()
    for block in func.body.blocks:
        for binding in block.bindings:
            if isinstance(binding, relax.VarBinding) and _on_constants(binding.value, constant):
                constant.add(binding.var)
    return constant


def constant_chain(var: relax.Var, lookup: Callable[[relax.Var], relax.Expr | None],
                   constant: set) -> list[relax.VarBinding] | None:
    """The bindings that compute ``var`` from constants alone, in program order with ``var``
    last; None when ``var`` is not one of ``constant`` (``constant_vars``: it reads a
    parameter, a ``call_tir`` or an impure op). Only the chain itself is walked."""
    if var not in constant:
        return None
    order: list[relax.VarBinding] = []
    seen: set = set()
    stack: list = [(var, False)]
    while stack:  # depth first, each binding after the ones it reads
        v, expanded = stack.pop()
        if expanded:
            order.append(relax.VarBinding(v, lookup(v)))
        elif v not in seen:
            if v not in constant:  # a variable this pass made: not a chain it knows
                return None
            seen.add(v)
            stack.append((v, True))
            stack += [(a, False) for a in reversed(lookup(v).args) if isinstance(a, relax.Var) and a not in seen]
    return order


def _static_size(ty: relax.Type) -> int | None:
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    dims = ty.shape.values
    if not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return int(np.prod([int(d) for d in dims]))


def _spans_axes(expr: object) -> bool:
    """Whether ``expr`` has two axes or more of extent above 1: a mask or a fill, not a
    per-channel bias or scale. Those keep their shape: the kernels' epilogues take them as
    they are, and trained ones are not uniform (a random-init model's zero biases are)."""
    ty = expr.ty if isinstance(expr, relax.Expr) else None
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return False
    return sum(1 for d in ty.shape.values if not (isinstance(d, tvm.tirx.IntImm) and int(d) == 1)) >= 2


def _broadcasts(value: relax.Expr) -> bool:
    """A pointwise op or a matmul: an op that broadcasts its operands itself."""
    return isinstance(value, relax.Call) and (
        is_pointwise(value) or (isinstance(value.op, tvm.ir.Op) and value.op.name == "relax.matmul"))


@mutator
class _Dropper(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, uniform_scalars: bool = True) -> None:
        super().__init__(mod)
        self.uniform_scalars = uniform_scalars  # CompileOptions.uniform_constants_as_scalars
        self.evaluated: dict = {}  # var -> its rank-0 value, or None
        self.constant: set = set()  # the visited function's constant_vars

    def _source(self, arg: relax.Expr, bound: relax.Expr | None,
                chain: Callable[[relax.Var], tvm.ir.Constant | None]) -> relax.Expr | None:
        """What operand ``arg`` (bound to ``bound``) of a broadcasting op can be replaced
        by: its broadcast's source, or its one element when uniform, a chain of ops on
        constants asked of ``chain``."""
        source = broadcast_source(bound)
        if source is None and self.uniform_scalars and _spans_axes(arg):
            source = uniform_constant(arg if bound is None else bound)  # a constant, or a binding of one
            if source is None and bound is not None and not isinstance(bound, tvm.ir.Constant):
                source = chain(arg)
        return source

    def _chain(self, var: relax.Var, lookup: Callable[[relax.Var], relax.Expr | None]) -> list | None:
        """``constant_chain`` of ``var`` when its value is small enough to evaluate."""
        size = _static_size(var.ty)
        return constant_chain(var, lookup, self.constant) if size and size <= MAX_EVALUATED else None

    def prepare(self, func: relax.Function) -> None:
        """``uniform_chain`` of every operand the visit will ask about, evaluated at once
        (``evaluate_static``: a kernel that many chains share is built once: Swin's
        windowed attention masks, one chain per block); left to ``uniform_chain`` one by
        one when a chain has symbolic dims or the batch does not build."""
        bindings = {b.var: b.value for blk in func.body.blocks for b in blk.bindings
                    if isinstance(b, relax.VarBinding)}
        asked: list[relax.Var] = []
        for value in bindings.values():
            if _broadcasts(value):
                for arg in value.args:
                    self._source(arg, bindings.get(arg) if isinstance(arg, relax.Var) else None,
                                 lambda var: asked.append(var))
        chains = {}
        for var in asked:
            if var not in chains and var not in self.evaluated:
                chain = self._chain(var, bindings.get)
                if chain and not any(relax.analysis.tir_vars_in_type(b.var.ty) for b in chain):
                    chains[var] = chain
        if not chains:
            return
        needed = {b.var for chain in chains.values() for b in chain}
        try:
            values = evaluate_static([relax.VarBinding(v, value) for v, value in bindings.items() if v in needed],
                                     list(chains))
        except Exception:  # noqa: BLE001 - an op LegalizeOps cannot build: each chain on its own
            return
        for var, value in values.items():
            self.evaluated[var] = uniform_constant(value)

    def uniform_chain(self, var: relax.Var) -> tvm.ir.Constant | None:
        """The rank-0 value of ``var`` when a chain of ops on constants computes it and
        every element it computes has the same bits (``constant_chain``); else None."""
        if var not in self.evaluated:
            chain = self._chain(var, self.lookup_binding)
            try:
                value = evaluate_at_bounds(chain, {}) if chain else None
            except Exception:  # noqa: BLE001 - an op LegalizeOps cannot build: the chain stays
                value = None
            self.evaluated[var] = uniform_constant(value)
        return self.evaluated[var]

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not _broadcasts(call):
            return call
        args = list(call.args)
        for i, arg in enumerate(args):
            source = self._source(arg, self.lookup_binding(arg) if isinstance(arg, relax.Var) else None,
                                  self.uniform_chain)
            if source is None:
                continue
            trial = args[:i] + [source] + args[i + 1:]
            try:
                new = self.builder_.normalize(relax.Call(call.op, trial, call.attrs, call.ty_args))
            except Exception:  # noqa: BLE001 - inference rejects the operands: keep the explicit one
                continue
            if tvm_ffi.structural_equal(new.ty, call.ty):
                args = trial
        if all(a.same_as(b) for a, b in zip(args, call.args)):
            return call
        return relax.Call(call.op, args, call.attrs, call.ty_args)


@tvm.transform.module_pass(opt_level=0, name="ImplicitBroadcasts")
class ImplicitBroadcasts:
    """Let pointwise ops and matmul broadcast their operands themselves (module docstring);
    uniform constant operands only under ``options.uniform_constants_as_scalars``."""

    def __init__(self, options: CompileOptions | None = None) -> None:
        self.options = options_or_default(options)

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        dropper = _Dropper(mod, self.options.uniform_constants_as_scalars)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function) and not (func.attrs and "Primitive" in func.attrs):
                dropper.constant = constant_vars(func)
                dropper.prepare(func)
                dropper.builder_.update_func(gv, dropper.visit_expr(func))
        return relax.transform.DeadCodeElimination()(dropper.builder_.get())


__all__ = ["ImplicitBroadcasts", "broadcast_source", "constant_chain", "constant_vars", "uniform_constant"]
