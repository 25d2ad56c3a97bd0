"""Check kernels: gather indices computed from the inputs are checked when the model runs.

An index that is neither a constant nor proven in range (a token id, an ``argmax``) can
only be checked at run time. ``emit_checked`` puts a small kernel in front of the gather:
it reads the indices once, calls ``aicf.index_out_of_range`` (``aicf_tvm.call_checks``:
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
from typing import Any

import tvm
from tvm import relax, te, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from aicf_tvm import call_checks
from aicf_tvm.errors import UnsupportedModelError

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

    def body(*idx: tirx.PrimExpr) -> tirx.PrimExpr:
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
                 lookup: Callable[[relax.Var], Any] | None = None) -> relax.Expr | None:
    """A check call of constant indices against static extents, decided at compile time:
    the checked indices as a constant, or ``UnsupportedModelError`` for one out of range
    (PyTorch and ONNX refuse the model too); None for any other call."""
    extents = checked_extents(call, mod, lookup)
    src = call.args[1].fields[0] if extents is not None else None
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
    return relax.const(fixed.astype(str(out_ty.dtype)))


def checked_extents(value: Any, mod: tvm.IRModule,
                    lookup: Callable[[relax.Var], Any] | None = None) -> list | None:
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


__all__ = ["CHECK_ATTR", "HostIndexChecks", "check_kernel", "checked_extents", "emit_checked",
           "folded_check"]
