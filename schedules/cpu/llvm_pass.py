"""The PrimFunc pass form shared by the rewrites that run after scheduling on LLVM CPUs."""

from __future__ import annotations

from typing import Callable

import tvm
from tvm import tirx
from tvm.target import Target
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
