"""LowerEmits: every Emit function becomes one PrimFunc called with ``call_tir``.

Runs last among our passes, on a module whose Emits are final. ``LegalizeOps`` turns
the ops inside each Emit function into TensorIR, ``FuseTIR`` merges each Emit function
into one PrimFunc named after it. FuseTIR drops custom function attrs, so the Emit
(kind, contract) is carried onto the PrimFunc here as ``aicf.emit``, and the ABI facts
of its ports as buffer alignment (DESIGN §7). Sound: both TVM passes preserve the
semantics of each function; we only add attrs and raise buffer alignment where the
contract proves it.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax, tirx

from aicf_tvm.emit import EMIT_ATTR, Emit, emit_of


def kernel_calls(func: relax.Function) -> list[str]:
    """Names of the PrimFuncs ``func`` calls through call_tir, in program order."""
    out: list[str] = []
    for block in func.body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name.startswith("relax.call_tir"):
                out.append(v.args[0].name_hint)
    return out


def _aligned(func: tirx.PrimFunc, emit: Emit) -> tirx.PrimFunc:
    """Raise each port buffer's alignment to what the contract proves (never lower it)."""
    ports = emit.interface.inputs + emit.interface.outputs
    params = list(func.params)
    if len(params) != len(ports):
        return func
    new_map = {}
    for param, port in zip(params, ports):
        buf = func.buffer_map.get(param)
        want = emit.contract.provides.port(port.name).abi.alignment.bytes
        if buf is None or want <= buf.data_alignment:
            continue
        new_map[param] = tirx.decl_buffer(buf.shape, buf.dtype, buf.name, buf.data, buf.strides,
                                          buf.elem_offset, buf.scope(), want, buf.offset_factor)
    if not new_map:
        return func
    buffer_map = {p: new_map.get(p, func.buffer_map[p]) for p in params if p in func.buffer_map}
    return tirx.PrimFunc(params, func.body, func.ret_type, buffer_map, func.attrs)


@tvm.transform.module_pass(opt_level=0, name="LowerEmits")
class LowerEmits:
    """Legalize and fuse each Emit function into a PrimFunc carrying the Emit."""

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        emits: dict[str, Emit] = {}
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                emit = emit_of(func)
                if emit is not None:
                    emits[gv.name_hint] = emit
        # RewriteDataflowReshape turns reshape-pattern kernels into views (no kernel runs);
        # the backend runs it too, but here the kernel list reflects what really runs.
        mod = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.FuseTIR(),
                                        relax.transform.RewriteDataflowReshape()])(mod)
        for gv, func in list(mod.functions_items()):
            emit = emits.get(gv.name_hint)
            if isinstance(func, tirx.PrimFunc) and emit is not None:
                func = _aligned(func, emit) if _can_align(func) else func
                mod[gv] = func.with_attr(EMIT_ATTR, emit.to_attr()).with_attr("aicf.kind", emit.kind)
        return mod


def _can_align(func: Any) -> bool:
    return hasattr(tirx, "decl_buffer") and hasattr(func, "buffer_map")
