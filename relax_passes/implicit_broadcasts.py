"""ImplicitBroadcasts: drop an explicit broadcast that its consumer makes anyway.

Frontends spell out broadcasts that the consuming op would do by itself: PyTorch's
``matmul`` of a ``[batch, seq, k]`` activation by a ``[k, n]`` weight decomposes, with a
symbolic batch, into ``bmm(x, expand(w, [batch, k, n]))``, and SDPA's all-masked-row guard
is ``where(cond, full_like(p, 0), p)``. With static shapes constant folding turns both into
constants; with a symbolic batch or length they stay kernels that write a tensor of the
full shape every call (a copy of the weight per batch element, a tensor of zeros), and
they sit between ops a fused candidate would cover. This pass replaces such an operand by
what it broadcasts: ``broadcast_to(b, s)`` by ``b``, ``full_like(x, c)`` of a rank-0
constant ``c`` (of the result's dtype) by ``c``, wherever the consumer is a pointwise op
(``is_pointwise``) or a ``matmul`` and its result type stays exactly the same.

Sound: pointwise ops and ``matmul``'s batch axes broadcast their operands by NumPy's rules,
and broadcasting composes (broadcasting ``b`` to ``s`` and the result to the output is
broadcasting ``b`` to the output), so when the output shape is unchanged every output
element reads the same operand elements. A ``matmul``'s last two axes are not broadcast:
the type check refuses a change there (the shape, or the inference, would differ). Runs
on op-level Relax, before LiftEmits; the broadcasts left unused go with dead-code
elimination.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from aicf_tvm.kinds.describe import is_pointwise


def broadcast_source(value: Any) -> Any:
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


@mutator
class _Dropper(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not (is_pointwise(call) or (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.matmul")):
            return call
        args = list(call.args)
        for i, arg in enumerate(args):
            bound = self.lookup_binding(arg) if isinstance(arg, relax.Var) else None
            source = broadcast_source(bound)
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
    """Let pointwise ops and matmul broadcast their operands themselves (module docstring)."""

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        dropper = _Dropper(mod)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function) and not (func.attrs and "Primitive" in func.attrs):
                dropper.builder_.update_func(gv, dropper.visit_expr(func))
        return relax.transform.DeadCodeElimination()(dropper.builder_.get())


__all__ = ["ImplicitBroadcasts", "broadcast_source"]
