"""CombineInt4Calls: the quantized linear layers of one input become one kernel call.

``compile_causal_lm(weights="int4")`` (and ``activations="int8"``) imports each linear
layer as a ``call_tir`` of a hand-written kernel of ``schedules.cpu.linear_int4`` over the
layer's packed constant weight (``aicf_tvm.driver.frontends.int4``). Attention's q, k and
v projections, and a gated MLP's gate and up projections, read one input: as separate
calls they start the thread pool once each, the smaller ones (a grouped-query k or v of
256 outputs: 4 tasks) too short to share out. This pass, on op-level Relax, rewrites each
group of such calls to

    y = call_tir(kernel for N_1 + ... + N_n outputs, x, concat(packed_i), concat(scales_i))
    p_i = strided_slice(y, axis=-1, begin=N_1 + ... + N_(i-1), end=N_1 + ... + N_i)

A group: calls in one dataflow block of kernels of one form (their attribute, ``N``
aside: the same ``K``, scale dtype, register blocking, int8 activations and weight bits),
whose weights and scales are constants and whose inputs are one value (the same
variable, or reshapes of one variable to one shape: the frontend flattens the input once
per layer). The packed layouts are blocks of 64 outputs along their first axis, so the
concatenations along it are the combined weight.

Sound: every kernel of the module computes each block of 64 outputs as its own task, from
the input (rounded, with int8 activations, by the same row-wise rule whatever ``N``) and
that block's weights, in an order that does not depend on ``N``; a slice only moves
elements. Tests compare the combined build with the uncombined one bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import tvm
from tvm import relax, tirx

from .dataflow_rewrite import operand_key, rewrite_and_drop_dead, splice_block

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


# (kernel, outputs, name) -> the same kernel for that many outputs
Rebuild = Callable[[tirx.PrimFunc, int, str], tirx.PrimFunc]


def _form(mod: tvm.IRModule, binding: relax.VarBinding, forms: Sequence[str]) -> tuple | None:
    """(form attribute, its fields but ``N``, N, input, packed, scales) of an int4 kernel call."""
    value = binding.value
    if not isinstance(value, relax.Call) or not value.op.same_as(_CALL_TIR):
        return None
    gv, args = value.args[0], value.args[1]
    func = mod[gv] if isinstance(gv, relax.GlobalVar) else None  # a call_tir's callee is in the module
    attrs = func.attrs if isinstance(func, tirx.PrimFunc) else None
    if attrs is None or not isinstance(args, relax.Tuple) or len(args.fields) != 3:
        return None
    found = [a for a in forms if a in attrs]
    x, packed, scales = args.fields
    if not found or not isinstance(packed, tvm.ir.Constant) or not isinstance(scales, tvm.ir.Constant):
        return None
    n, *rest = str(attrs[found[0]]).split()
    return found[0], tuple(rest), int(n), x, packed, scales


def _combine(bb: relax.BlockBuilder, mod: tvm.IRModule, block: relax.DataflowBlock, forms: Sequence[str],
             rebuild: Rebuild) -> tuple[relax.DataflowBlock, bool]:
    reshapes = {b.var: b for b in block.bindings
                if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
                and b.value.op.name == "relax.reshape"}
    groups: dict = {}
    for b in block.bindings:
        form = _form(mod, b, forms)
        if form is not None:
            attr, rest, _n, x, _p, _s = form
            groups.setdefault((attr, rest, operand_key(x, reshapes)), []).append((b, form))
    groups = {key: members for key, members in groups.items() if len(members) > 1}
    if not groups:
        return block, False
    before, replace = {}, {}
    for members in groups.values():
        lead, (attr, _rest, _n, x, _p, _s) = members[0]
        widths = [form[2] for _b, form in members]
        packed = np.concatenate([form[4].value.numpy() for _b, form in members], axis=0)
        scales = np.concatenate([form[5].value.numpy() for _b, form in members], axis=0)
        name = f"{lead.value.args[0].name_hint}_x{len(members)}_{sum(widths)}"
        kernel = rebuild(mod[lead.value.args[0]], sum(widths), name)
        gv = bb.add_func(kernel, name)
        shape = [*lead.var.ty.shape.values[:-1], sum(widths)]
        call = relax.call_tir(gv, [x, relax.const(packed, str(packed.dtype)), relax.const(scales, str(scales.dtype))],
                              relax.TensorType(shape, str(lead.var.ty.dtype)))
        y = relax.DataflowVar(f"{lead.var.name}_combined", bb.normalize(call).ty)
        before[lead.var] = [relax.VarBinding(y, call)]
        start, axis = 0, len(shape) - 1
        for (b, _form_), width in zip(members, widths, strict=True):
            piece = bb.normalize(relax.op.strided_slice(y, axes=[axis], begin=[start], end=[start + width]))
            replace[b.var] = [relax.VarBinding(b.var, piece)]
            start += width
    return splice_block(block, replace, before=before), True


@tvm.transform.module_pass(opt_level=0, name="CombineInt4Calls")
class CombineInt4Calls:
    """Merge the calls of one input to the kernels whose form attribute is one of ``forms``
    (``"N K ..."``: the number of outputs first) into one call read through slices;
    ``rebuild`` gives such a kernel for more outputs (the driver passes
    ``schedules.cpu.linear_int4``'s ``KERNEL_FORMS`` and ``with_outputs``: passes do not
    import the schedules)."""

    def __init__(self, forms: Sequence[str], rebuild: Rebuild) -> None:
        self.forms, self.rebuild = tuple(forms), rebuild

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        out = rewrite_and_drop_dead(mod, lambda bb, block, _uses: _combine(bb, mod, block, self.forms, self.rebuild))
        return out if out.same_as(mod) else _drop_uncalled(out, self.forms)


def _drop_uncalled(mod: tvm.IRModule, forms: Sequence[str]) -> tvm.IRModule:
    """``mod`` without the int4 kernels no Relax function calls any more (the combined
    ones' parts: a PrimFunc with a global symbol outlives DeadCodeElimination)."""
    called: set = set()
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(
                func.body, lambda e: called.add(e.name_hint) if isinstance(e, relax.GlobalVar) else None)
    out = mod
    for gv, func in mod.functions_items():
        attrs = func.attrs if isinstance(func, tirx.PrimFunc) else None
        if attrs is not None and any(a in attrs for a in forms) and gv.name_hint not in called:
            out = out.clone() if out is mod else out
            del out[gv]
    return out


__all__ = ["CombineInt4Calls"]
