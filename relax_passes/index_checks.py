"""Check kernels: gather and scatter indices computed from the inputs are checked when the
model runs.

An index that is neither a constant nor proven in range (a token id, an ``argmax``) can
only be checked at run time. ``IndexChecker.checked`` decides what to check (the proof of
indices in range, and the source the check reads: ``relax_passes.normalize_indices``
states both), and ``emit_checked`` puts a small kernel in front of the op:
it reads the indices once, calls ``aicf.index_out_of_range`` (``aicf_tvm.runtime.call_checks``:
raises our ``InputError`` through the FFI, naming the indices, the offending index, its
position and the bound) on the first index outside ``[-n, n)`` (negative ones counting
from the end, as ONNX and NumPy define them) or ``[0, n)`` (where the op rejects negative
indices, as PyTorch's embedding does), and writes the indices with negative ones counted
from the end, in the gather's index dtype. The gather then reads only indices in
``[0, n)``: its own mode can be ``clip`` (TVM's ``fast`` warns that it may read out of
bounds; on indices in range ``clip`` reads the same elements).

The kernel is a TIR PrimFunc called with ``call_tir``, marked scheduled (its serial loop
must stay serial: a worker thread of a parallel loop could not carry the error back),
opaque to TVM's FuseOps and ``aicf.check_indices``; ``LiftEmits`` leaves the call alone (its
extents are scalar arguments, not tensor ports). A target whose kernels
cannot call the host (CUDA) runs the same check on the host instead: ``HostIndexChecks``
turns each such call into a call of ``aicf.check_indices_on_host``.

Sound: on indices in range the kernel returns them as they are (a negative one ``i`` as
``i + n``, the element the op defines for it), so the gather reads what it read before;
on any other index it raises, where PyTorch and ONNX Runtime raise too.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax, te, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from aicf_tvm.core.errors import UnsupportedModelError
from aicf_tvm.runtime import call_checks

Extent = int | tvm.ir.Expr

CHECK_ATTR = "aicf.check_indices"
_RAISE = "aicf.index_out_of_range"
_HOST_CHECK = "aicf.check_indices_on_host"
assert call_checks.index_out_of_range is not None  # registers both functions with the FFI


def check_kernel(src_ty: relax.TensorType, count: int, out_dtype: str, from_end: bool,
                 subject: str, op: str) -> tirx.PrimFunc:
    """The check of indices of type ``src_ty`` against ``count`` extents (scalar params; with
    several, position ``j`` of the last axis is checked against extent ``j``: gather_nd)."""
    dims = [tirx.Var(f"d{k}", "int64") for k in range(src_ty.ndim)]
    src = te.placeholder(dims, str(src_ty.dtype), "indices")
    extents = [tirx.Var(f"n{j}", "int64") for j in range(count)]
    dtype = str(src_ty.dtype)
    unsigned = dtype.startswith("uint")

    def body(*idx: tirx.Expr) -> tirx.Expr:
        n = extents[0]
        for j in range(1, count):
            n = tirx.Select(idx[-1] == j, extents[j], n)
        value = src(*idx)
        if dtype == "uint64":  # beyond int64: compared as unsigned
            low = tirx.const(0, "int64")
            bad, fixed, shown = value >= n.astype(dtype), value, value
        else:
            value = value.astype("int64")
            low = -n if from_end and not unsigned else tirx.const(0, "int64")
            bad, shown = tirx.any(value < low, value >= n), value
            fixed = tirx.Select(value < 0, value + n, value)
        raised = tirx.call_packed(_RAISE, subject, op, shown, low, n, dtype, *idx)
        return tirx.if_then_else(bad, raised.astype(out_dtype), fixed.astype(out_dtype))

    out = te.compute(dims, body, name="checked")
    func = te.create_prim_func([src, *extents, out]).without_attr("global_symbol")
    # op_pattern 8 (opaque): TVM's FuseOps would fuse it with its neighbours otherwise
    attrs = {"tirx.is_scheduled": True, "op_pattern": 8, "aicf.kind": "check_indices",
             "aicf.schedule": "serial check",
             CHECK_ATTR: {"from_end": from_end, "subject": subject, "op": op}}
    for key, value in attrs.items():
        func = func.with_attr(key, value)
    return func


def emit_checked(bb: relax.BlockBuilder, src: relax.Expr, extents: list, out_dtype: str,
                 from_end: bool, subject: str, op: str) -> relax.Expr:
    """The check of ``src`` against ``extents``, emitted (decided now when ``src`` is a
    constant: ``folded_check``); the result has ``src``'s shape and ``out_dtype`` and
    holds indices in ``[0, n)``."""
    kernel = check_kernel(src.ty, len(extents), out_dtype, from_end, subject, op)
    gv = bb.add_func(kernel, "check_indices")
    args = [src, *[tirx.IntImm("int64", e) if isinstance(e, int) else e for e in extents]]
    call = relax.call_tir(gv, args, relax.TensorType(src.ty.shape, out_dtype))
    folded = folded_check(call, bb.get())
    return folded if folded is not None else bb.emit(call)


def folded_check(call: relax.Call, mod: tvm.IRModule,
                 lookup: Callable[[relax.Var], relax.Expr | None] | None = None) -> relax.Expr | None:
    """A check call of constant indices against static extents, decided at compile time:
    the checked indices as a constant, or ``UnsupportedModelError`` for one out of range
    (PyTorch and ONNX refuse the model too); None for any other call."""
    extents = checked_extents(call, mod, lookup)
    src = call.args[1].fields[0] if extents is not None else None
    if isinstance(src, relax.Var) and lookup is not None:  # a var bound to folded indices
        src = lookup(src)
    if not isinstance(src, tvm.ir.Constant) or any(not isinstance(e, tirx.IntImm) for e in extents):
        return None
    info = mod.functions[call.args[0]].attrs[CHECK_ATTR]
    fixed, bad = call_checks.check_values(src.value.numpy(), [int(e) for e in extents],
                                          bool(info["from_end"]))
    if bad is not None:
        value, at, low, high = bad
        raise UnsupportedModelError(f"{info['op']}: constant index {value} at {list(at)} is out "
                                    f"of range [{low}, {high})")
    out_ty = call.ty_args[0] if call.ty_args else call.ty  # an emitted call's own type
    # the dtype named: relax.const makes an int64 array int32 when not told
    return relax.const(fixed.astype(str(out_ty.dtype)), str(out_ty.dtype))


def checked_extents(value: relax.Expr, mod: tvm.IRModule,
                    lookup: Callable[[relax.Var], relax.Expr | None] | None = None) -> list | None:
    """The extents ``value`` (a bound value) was checked against when it is a check
    kernel's call, else None; ``lookup`` gives the value of a var bound to an extent."""
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name == "relax.call_tir" and isinstance(value.args[0], relax.GlobalVar)):
        return None
    func = mod.functions.get(value.args[0])
    if not isinstance(func, tirx.PrimFunc) or func.attrs is None or CHECK_ATTR not in func.attrs:
        return None
    extents = []
    for arg in list(value.args[1].fields)[1:]:  # the extents: TIR integer expressions
        arg = lookup(arg) if isinstance(arg, relax.Var) and lookup is not None else arg
        if not str(getattr(arg, "ty", "")).startswith("int"):
            return None
        extents.append(arg)
    return extents


def static_extents(extents: list[Extent | None]) -> list[int] | None:
    """The extents as ints when every one is static, else None."""
    if any(not isinstance(e, (int, tirx.IntImm)) for e in extents):
        return None
    return [int(e) for e in extents]


def holds_range(dtype: str, extents: list[Extent]) -> bool:
    """Whether integer ``dtype`` holds every index in ``[-n, n)`` of each extent (symbolic
    extents: only 64-bit signed dtypes do)."""
    if not dtype.startswith("int"):
        return False
    bits = int(dtype[3:])
    static = static_extents(extents)
    return bits >= 64 or (static is not None and all(n <= 2 ** (bits - 1) for n in static))


# Ops whose every output element is an element of their first operand.
_VALUE_VIEWS = frozenset({"relax.expand_dims", "relax.reshape", "relax.broadcast_to",
                          "relax.squeeze", "relax.permute_dims"})


class IndexChecker:
    """Emits the checks of gather and scatter indices into ``bb`` (what it proves and what it
    reads: ``relax_passes.normalize_indices``); ``lookup`` gives
    a var's bound value, ``params`` are the function's inputs (named in messages)."""

    def __init__(self, bb: relax.BlockBuilder, lookup: Callable[[relax.Var], relax.Expr | None], params: list,
                 from_end: bool = True) -> None:
        self.bb, self.lookup, self.params, self.from_end = bb, lookup, params, from_end

    def checked(self, indices: relax.Expr, extents: list[Extent], op: str) -> relax.Expr:
        """``indices`` themselves when proven in ``[0, extents)``, else their check."""
        if self.in_range(indices, extents):
            return indices
        src, views, from_end = self._source(indices, extents, self.from_end)
        named = next((p.name for p in self.params if p.same_as(src)), None)
        what = op.split(" ")[0]
        subject = f"input {named}" if named else f"the indices of {what} (computed in the model)"
        out = emit_checked(self.bb, src, extents, str(indices.ty.dtype), from_end, subject, op)
        for view in views:  # the same views of the checked values
            out = self.bb.emit(relax.Call(view.op, [out, *view.args[1:]], view.attrs, view.ty_args))
        return out

    def in_range(self, indices: relax.Expr, extents: list[Extent]) -> bool:
        """Whether every index is proven in ``[0, extents[j])``: an arange within the extent
        or a check against extents no larger, through views (one extent only) and casts."""
        value = self._value(indices)
        proven = checked_extents(value, self.bb.get(), self.lookup)
        if proven is not None:
            return len(proven) == len(extents) and all(
                tvm.sym.Analyzer().can_prove(a <= b) for a, b in zip(proven, extents))
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return False
        name = value.op.name
        if name == "relax.astype" and holds_range(str(value.ty.dtype), extents):
            return self.in_range(value.args[0], extents)
        if len(extents) != 1:
            return False
        if name in _VALUE_VIEWS or (name == "relax.add" and _is_int_zero(value.args[1])):
            return self.in_range(value.args[0], extents)
        if name == "relax.arange" and len(value.args) == 3:
            start, end, step = value.args
            return (_is_int(start, 0) and _is_int(step, 1) and str(end.ty).startswith("int")
                    and tvm.sym.Analyzer().can_prove(end <= extents[0]))
        return False

    def _source(self, indices: relax.Expr, extents: list[Extent],
                from_end: bool) -> tuple[relax.Expr, list, bool]:
        """The tensor to check for ``indices`` (module docstring), the views from it to them
        in order, and whether its negative indices count from the end."""
        value = self._value(indices)
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return indices, [], from_end
        name = value.op.name
        if name == "relax.astype" and holds_range(str(value.ty.dtype), extents) and \
                str(value.args[0].ty.dtype).startswith(("int", "uint")):
            return self._source(value.args[0], extents, from_end)
        counted = self._counted_from_end(value, extents)
        if counted is not None:
            return self._source(counted, extents, True)
        if name in _VALUE_VIEWS and len(extents) == 1:
            src, views, fe = self._source(value.args[0], extents, from_end)
            return src, [*views, value], fe
        return indices, [], from_end

    def _counted_from_end(self, value: relax.Call, extents: list[Extent]) -> relax.Expr | None:
        """``i`` when ``value`` is ``where(i < 0, i + n, i)`` with ``n`` the (static) extents
        (ONNX's Gather, GatherElements and GatherND count negative indices so), else None."""
        static = static_extents(extents)
        if value.op.name != "relax.where" or static is None:
            return None
        cond, added = self._value(value.args[0]), self._value(value.args[1])
        src = value.args[2]
        if not (_is_call(cond, "relax.less") and _is_call(added, "relax.add")
                and _is_int_zero(cond.args[1])
                and cond.args[0].same_as(src) and added.args[0].same_as(src)
                and isinstance(added.args[1], tvm.ir.Constant)):
            return None
        n = added.args[1].value.numpy()
        wanted = np.array(static if len(static) > 1 else static[0])
        if n.size == 0 or n.ndim > 1 or (n.ndim == 1 and n.shape[0] not in (1, wanted.size)):
            return None
        n = np.broadcast_to(n, np.broadcast_shapes(n.shape, wanted.shape))
        return src if np.all(n == wanted) else None

    def _value(self, expr: relax.Expr) -> relax.Expr | None:
        return self.lookup(expr) if isinstance(expr, relax.Var) else expr


def _is_call(value: relax.Expr | None, op: str) -> bool:
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == op


def _is_int(expr: tvm.ir.Expr, value: int) -> bool:
    return isinstance(expr, tirx.IntImm) and int(expr.value) == value


def _is_int_zero(expr: relax.Expr) -> bool:
    """An integer constant whose every element is 0."""
    if not isinstance(expr, tvm.ir.Constant) or not str(expr.ty.dtype).startswith(("int", "uint")):
        return False
    return not np.any(expr.value.numpy())


@mutator
class _ToHost(PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.mod = mod

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if checked_extents(call, self.mod) is None:
            return call
        info = self.mod.functions[call.args[0]].attrs[CHECK_ATTR]
        src, *extents = list(call.args[1].fields)
        args = [src, tvm.ir.StringImm(str(info["subject"])), tvm.ir.StringImm(str(info["op"])),
                relax.prim_value(tirx.IntImm("int64", int(bool(info["from_end"])))),
                tvm.ir.StringImm(str(call.ty.dtype)), *extents]
        return relax.call_pure_packed(_HOST_CHECK, *args, ty_args=call.ty)


@tvm.transform.module_pass(opt_level=0, name="HostIndexChecks")
class HostIndexChecks:
    """Run every check kernel's check on the host (module docstring); the kernels go."""

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        checks = [gv for gv, f in mod.functions_items()
                  if isinstance(f, tirx.PrimFunc) and f.attrs is not None and CHECK_ATTR in f.attrs]
        if not checks:
            return mod
        mutator_ = _ToHost(mod)
        for gv, func in list(mod.functions_items()):
            if isinstance(func, relax.Function):
                mutator_.builder_.update_func(gv, mutator_.visit_expr(func))
        out = mutator_.builder_.get()
        for gv in checks:
            del out[gv]
        return out


__all__ = ["CHECK_ATTR", "HostIndexChecks", "IndexChecker", "check_kernel", "checked_extents",
           "emit_checked", "folded_check", "holds_range", "static_extents"]
