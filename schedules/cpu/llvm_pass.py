"""The PrimFunc pass form shared by the rewrites that run after scheduling on LLVM CPUs."""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import tirx
from tvm.ir import Expr
from tvm.ir import op as ir_op
from tvm.target import Target
from tvm.tirx import CallEffectKind
from tvm.tirx.transform import prim_func_pass


def llvm_prim_func_pass(rewrite: Callable[[tirx.PrimFunc], tirx.PrimFunc], target: Target | None,
                        name: str) -> tvm.transform.Pass:
    """A PrimFunc pass applying ``rewrite`` to the PrimFuncs compiled for an LLVM target.

    The target is the PrimFunc's ``target`` attr, else ``target``, else the enclosing
    ``with target:``; PrimFuncs for other targets are left alone.
    """

    def _apply(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx: object) -> tirx.PrimFunc:
        func_target = func.attrs.get("target") if func.attrs is not None else None
        func_target = func_target or target or Target.current(allow_none=True)
        if func_target is None or func_target.kind.name != "llvm":
            return func
        return rewrite(func)

    return prim_func_pass(_apply, opt_level=0, name=name)


def register_sealed_op(op_name: str, lower: Callable[[tirx.Call], Expr]) -> None:
    """Register an op of our own that TIR's simplifier cannot look into (a pure call) and
    TVM's vectorizer vectorizes, turned into plain TIR by ``lower`` in ``LowerIntrin``, the
    last pass before LLVM code generation (``ieee_arith``, ``int_arith``)."""
    ir_op.register_op_attr(op_name, "TCallEffectKind", CallEffectKind.Pure.value)
    ir_op.register_op_attr(op_name, "TVectorizable", True)
    tirx.register_intrin_lowering(op_name, "llvm", f=lower, level=99)
