"""LiftEmits: turn every op call in a function's dataflow blocks into an Emit call.

Each binding ``y = R.op(x, ...)`` becomes ``y = emit_<kind>(x, ...)`` where
``emit_<kind>`` is a private Relax function marked ``Primitive`` whose ``aicf.emit``
attr holds the Emit (kind, attrs, interface, contract template; docs/design.md §2). Tensor
arguments (tuples of tensors flattened) become the Emit's ports; shapes, axes and other
non-tensor arguments stay inside it. Identical Emits share one function.

Runs first, on a module straight from a frontend. Sound because the body of each
function is the original call: the lifted module computes exactly what the input did
(inlining every Emit function gives the input back). A tensor extent such as
``batch * seq`` becomes a var of the function's own (``param_types``), bound at the
call. Structural bindings (tuples, tuple reads, aliases) and bindings outside dataflow
blocks are left as they are; so is a call whose non-tensor arguments use a symbolic
variable that its tensor arguments do not define, or a value of the caller (a shape such as
``shape_to_tensor``'s): the private function could not bind them.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from aicf_tvm.core.emit import EMIT_ATTR, emit_of, is_scheduled
from aicf_tvm.core.kinds.describe import (
    describe_call,
    flat_tensor_args,
    is_tensor,
    is_tensor_tuple,
    split_call,
)

# Ops that are runtime plumbing, not computations on tensors.
_NOT_EMITS = ("relax.builtin.", "relax.memory.", "relax.vm.", "relax.inspect.", "relax.grad.")
_NOT_EMIT_OPS = {
    "relax.shape_of", "relax.null_value", "relax.print", "relax.assert_op", "relax.tensor_to_shape",
    "relax.hint_on_device", "relax.to_vdevice", "relax.make_closure", "relax.invoke_closure",
    "relax.invoke_pure_closure", "relax.wrap_param",
}


def _returns_tensors(ty) -> bool:
    if isinstance(ty, relax.TensorType):
        return True
    fields = getattr(ty, "fields", None)
    return isinstance(ty, relax.TupleType) and bool(fields) and all(isinstance(f, relax.TensorType) for f in fields)


def is_liftable(call: relax.Expr) -> bool:
    """A call of a Relax op that computes tensors from tensors."""
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
        return False
    name = call.op.name
    if name in _NOT_EMIT_OPS or name.startswith(_NOT_EMITS):
        return False
    return _returns_tensors(call.ty)


def _param_name(port: str) -> str:
    return port.replace(".", "_")


def _is_var_in(var: tirx.Var, pool: list) -> bool:
    return any(var.same_as(v) for v in pool)


def defined_vars(types: list) -> list[tirx.Var]:
    """The symbolic vars that parameters of ``types`` define: those that are a whole extent
    (``batch`` in ``(batch, seq * 2)``; ``seq`` is only constrained there, not defined)."""
    return [d for ty in types for d in _dims(ty) if isinstance(d, tirx.Var)]


def param_types(types: list, defined: list | tuple = ()) -> list:
    """Parameter types for tensors of ``types``, each extent that uses a symbolic var no
    plain extent defines replaced by a fresh var (one per distinct extent).

    A parameter typed ``(batch * seq, 128)`` does not define ``batch`` or ``seq``, so a
    function taking it would have free vars; typed ``(d0, 128)`` it defines ``d0``, and a
    call with a ``(batch * seq, 128)`` argument binds ``d0 = batch * seq``: the function
    computes the same values for every binding. Vars in ``defined`` are defined otherwise
    (a group function's ``tir_vars`` parameter), so extents over them stay as they are."""
    defined = [*defined_vars(types), *defined]
    fresh: list[tuple[tirx.Expr, tirx.Var]] = []

    def abstract(d: tirx.Expr) -> tirx.Expr:
        if isinstance(d, (tirx.IntImm, tirx.Var)) or all(_is_var_in(v, defined)
                                                         for v in tirx.analysis.undefined_vars(d)):
            return d
        for expr, var in fresh:
            if tvm_ffi.structural_equal(expr, d):
                return var
        fresh.append((d, tirx.Var(f"d{len(fresh)}", d.ty)))
        return fresh[-1][1]

    out = []
    for ty in types:
        if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr):
            ty = relax.TensorType(relax.ShapeExpr([abstract(d) for d in ty.shape.values]), ty.dtype, ty.vdevice)
        out.append(ty)
    return out


def _dims(ty) -> list:
    shape = getattr(ty, "shape", None)
    return list(shape.values) if isinstance(shape, relax.ShapeExpr) else []


def build_emit_function(call: relax.Call) -> tuple[relax.Function, tuple] | None:
    """The private Emit function for ``call`` and the arguments to call it with."""
    sig = split_call(call)
    func = _emit_function(call, sig, [])
    tir_vars = list(relax.analysis.free_symbolic_vars(func))
    if tir_vars:  # a var of the caller in a non-tensor argument: passed as FuseOps passes it
        func = _emit_function(call, sig, tir_vars)
    if relax.analysis.free_symbolic_vars(func) or relax.analysis.free_vars(func):
        return None  # a var of the caller (a shape value) it cannot bind
    defined = relax.analysis.defined_symbolic_vars(func)
    if defined:  # each function must define its own symbolic variables
        func = func.bind_symbolic_vars({v: tvm.tirx.Var(v.name, v.ty) for v in defined})
    args = tuple(sig.tensor_args)
    return func, (*args, relax.ShapeExpr(tir_vars)) if tir_vars else args


def _emit_function(call: relax.Call, sig, tir_vars: list[tirx.Expr]) -> relax.Function:
    """The Emit function of ``call``; ``tir_vars`` (if any) its last parameter, a shape of the
    caller's symbolic vars that its non-tensor arguments use (``strided_slice(x, end=past)``
    of a static ``x``), so the parameters keep the caller's extents over them."""
    emit = describe_call(call, sig)
    types = param_types([a.ty for a in sig.tensor_args], defined=tir_vars)
    params = [relax.Var(_param_name(p), ty) for p, ty in zip(sig.port_names, types)]
    it = iter(params)
    new_args = []
    for arg in call.args:
        if is_tensor(arg):
            new_args.append(next(it))
        elif is_tensor_tuple(arg):
            new_args.append(relax.Tuple([next(it) for _ in arg.fields]))
        else:
            new_args.append(arg)
    body_call = relax.Call(call.op, new_args, call.attrs, call.ty_args)
    bb = relax.BlockBuilder()
    attrs = {"Primitive": True, EMIT_ATTR: emit.to_attr()}
    shape_params = [relax.Var("tir_vars", relax.ShapeType(tir_vars))] if tir_vars else []
    with bb.function("emit", [*params, *shape_params], attrs=attrs, private=True):
        with bb.dataflow():
            out = bb.emit_output(body_call)
        bb.emit_func_output(out)
    return bb.finalize()["emit"]


def _signature_key(call: relax.Call) -> tuple:
    """Cheap identity of the Emit a call lifts to (structural hashes, no printing)."""
    h = tvm_ffi.structural_hash
    return (
        call.op.name,
        h(call.attrs) if call.attrs is not None else 0,
        tuple(h(a.ty) if is_tensor(a) or is_tensor_tuple(a) else h(a) for a in call.args),
        h(call.ty),
    )


@mutator
class _Lifter(PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.cache: dict[tuple, relax.GlobalVar | None] = {}
        self.tir_vars: dict[tuple, list[tirx.Expr]] = {}  # per cached Emit: the caller's vars it takes
        self.in_dataflow = False

    def visit_dataflow_block_(self, block):
        self.in_dataflow = True
        try:
            return super().visit_dataflow_block_(block)
        finally:
            self.in_dataflow = False

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not (self.in_dataflow and is_liftable(call)) or self._calls_scheduled_kernel(call):
            return call
        key = _signature_key(call)
        if key not in self.cache:
            built = build_emit_function(call)
            if built is None:
                self.cache[key] = None
            else:
                last = built[1][-1] if built[1] else None
                self.tir_vars[key] = list(last.values) if isinstance(last, relax.ShapeExpr) else []
                name = f"emit_{emit_of(built[0]).kind}"
                self.cache[key] = self.builder_.add_func(built[0], name)
        gv = self.cache[key]
        if gv is None:
            return call
        args = flat_tensor_args(call)
        tir_vars = self.tir_vars[key]
        return relax.Call(gv, [*args, relax.ShapeExpr(tir_vars)] if tir_vars else args)


    def _calls_scheduled_kernel(self, call: relax.Call) -> bool:
        """A ``call_tir`` of a PrimFunc written and scheduled by hand (``tirx.is_scheduled``:
        ``aicf_tvm.driver.frontends.int4``'s kernels) stays as it is: no Emit could fuse it (its
        body is no block ``FuseTIR`` can merge)."""
        if call.op.name != "relax.call_tir" or not isinstance(call.args[0], relax.GlobalVar):
            return False
        mod = self.builder_.get()
        func = mod[call.args[0]] if call.args[0] in mod.get_global_vars() else None
        return isinstance(func, tirx.PrimFunc) and is_scheduled(func)


def lift_function(mod: tvm.IRModule, name: str = "main") -> tvm.IRModule:
    """Lift the Emits of one function (``main`` by default)."""
    lifter = _Lifter(mod)
    gv = mod.get_global_var(name)
    new_func = lifter.visit_expr(mod[gv])
    lifter.builder_.update_func(gv, new_func)
    return lifter.builder_.get()


@tvm.transform.module_pass(opt_level=0, name="LiftEmits")
class LiftEmits:
    """Lift every op call in the dataflow blocks of the module's public Relax functions.

    Functions that already carry Emits (``aicf.emit``) or are ``Primitive`` are skipped,
    so the pass is idempotent.
    """

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        for gv, func in list(mod.functions_items()):
            if not isinstance(func, relax.Function) or func.attrs is None:
                continue
            if "global_symbol" not in func.attrs or "Primitive" in func.attrs:
                continue
            mod = lift_function(mod, gv.name_hint)
        return mod
