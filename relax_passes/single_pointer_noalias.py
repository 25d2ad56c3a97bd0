"""SinglePointerNoAlias: mark PrimFuncs with at most one pointer parameter ``tirx.noalias``.

TVM 0.27's LLVM codegen drops ``noalias`` from the parameters of every function in a module
as soon as one function of it lacks the ``tirx.noalias`` attr. Relax's ``VMShapeLower``
adds such a function to every module with symbolic shapes (``shape_func``, which computes
shapes on the VM's shape heap), so each kernel of a dynamic model lost ``noalias``: LLVM
then could not keep a GEMM's C tile in registers across K (it stored the tile and reloaded
A on every step, so the dynamic kernel ran far slower than the static one of the same
schedule). Runs after Relax's VM lowering, as the last pass of the Relax pipeline.

Sound: ``noalias`` on a function's only pointer parameter states that no other parameter
points into the same memory, which holds when there is no other pointer parameter.
"""

from __future__ import annotations

import tvm
from tvm import tirx


def pointer_params(func: tirx.PrimFunc) -> int:
    """Parameters that are buffers or pointers (not scalars)."""
    return sum(1 for p in func.params if not isinstance(p.ty, tvm.ir.PrimType) or str(p.ty) == "handle")


@tvm.transform.module_pass(opt_level=0, name="SinglePointerNoAlias")
def SinglePointerNoAlias(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Set ``tirx.noalias`` on the PrimFuncs that take at most one pointer (module docstring)."""
    updates = {}
    for gv, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc) and not (func.attrs and func.attrs.get("tirx.noalias", False)):
            if pointer_params(func) <= 1:
                updates[gv] = func.with_attr("tirx.noalias", True)
    mod = mod.clone() if updates else mod  # the caller's module stays as it was
    for gv, func in updates.items():
        mod[gv] = func
    return mod


__all__ = ["SinglePointerNoAlias", "pointer_params"]
