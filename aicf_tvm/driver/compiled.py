"""A ``CompiledModel`` from the compiler's Relax modules: its signature, dim bounds and
requirements read off ``main``, its kernels off the lowered module, its Emit listing off
the optimized one (what ``export`` records). The runtime class itself imports no Relax
(``aicf_tvm.runtime.compiled``)."""

from __future__ import annotations

from functools import partial
from typing import Any

import tvm
from tvm import relax

from aicf_tvm.core.emit import PLAN_ATTR
from aicf_tvm.core.emit_table import emit_calls, emit_table
from aicf_tvm.core.kinds.describe import dim_value
from aicf_tvm.runtime.compiled import CompiledModel, Executable, Kernel, Signature, TensorSpec
from relax_passes.bound_shapes import bounds_of
from relax_passes.lower_emits import kernel_calls
from relax_passes.shape_requirements import requirements_of


def _specs_of_type(name: str, ty: relax.Type) -> list[TensorSpec]:
    if isinstance(ty, relax.TensorType):
        shape = tuple(dim_value(d) for d in ty.shape.values) if ty.shape is not None else ()
        return [TensorSpec(name, shape, str(ty.dtype))]
    fields = getattr(ty, "fields", None) or []
    out = []
    for i, f in enumerate(fields):
        out.extend(_specs_of_type(f"{name}.{i}", f))
    return out


def specs_of(func: relax.Function) -> tuple[list[TensorSpec], list[TensorSpec]]:
    inputs = [s for p in func.params for s in _specs_of_type(p.name, p.ty)]
    outputs = _specs_of_type("output", func.ret_ty)
    return inputs, outputs


def dim_bounds_of(func: relax.Function) -> dict[str, list]:
    """``{symbolic dim: [lower or None, upper or None]}`` from ``tir_var_*_bound`` attrs
    (JSON-able, as exported)."""
    return {name: list(pair) for name, pair in bounds_of(func).items()}


def signature_of(func: relax.Function) -> Signature:
    """A function's inputs, outputs, dim bounds and requirements."""
    inputs, outputs = specs_of(func)
    return Signature(inputs, outputs, dim_bounds_of(func), requirements_of(func))


def kernels_of(mod: tvm.IRModule) -> list[Kernel]:
    """The kernel of every call of every entry function (``main``'s first), in program order."""
    entries = sorted((gv.name_hint for gv, f in mod.functions_items() if isinstance(f, relax.Function)
                      and f.attrs is not None and "global_symbol" in f.attrs), key=lambda n: n != "main")
    out = []
    for name in [k for entry in entries for k in kernel_calls(mod[entry])]:
        attrs = mod[name].attrs
        kind = str(attrs["aicf.kind"]) if attrs is not None and "aicf.kind" in attrs else "tvm"
        sched = str(attrs["aicf.schedule"]) if attrs is not None and "aicf.schedule" in attrs else "unscheduled"
        plan = str(attrs[PLAN_ATTR]) if attrs is not None and PLAN_ATTR in attrs else ""
        out.append(Kernel(name, kind, sched, plan))
    return out


def emit_listing(optimized: tvm.IRModule) -> tuple[list, str]:
    """The Emit calls of ``main`` as JSON and the Emit table, as an export records them."""
    emits = [{"value": var.name, "callee": gv.name_hint, "emit": emit.to_attr()}
             for var, gv, emit in emit_calls(optimized)]
    return emits, emit_table(optimized)


def compiled_model(executable: Executable, target: tvm.target.Target, main: relax.Function, *,
                   lowered: tvm.IRModule | None = None, optimized: tvm.IRModule | None = None,
                   **kwargs: Any) -> CompiledModel:
    """A ``CompiledModel`` of ``executable`` whose signature is ``main``'s (the signatures
    of other entry functions go in ``functions``)."""
    sig = signature_of(main)
    return CompiledModel(
        executable, target, inputs=sig.inputs, outputs=sig.outputs, dim_bounds=sig.dim_bounds,
        requirements=sig.requirements, kernels=kernels_of(lowered) if lowered else [],
        lowered=lowered, optimized=optimized,
        emit_listing=partial(emit_listing, optimized) if optimized is not None else None, **kwargs)
