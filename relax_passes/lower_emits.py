"""LowerEmits: every Emit function becomes one PrimFunc called with ``call_tir``.

Runs last among our passes, on a module whose Emits are final. Final-lowering ABI
(docs/design.md §7), then TVM's own passes:

* a rank-0 constant port that the Emit only uses as an operand of elementwise
  arithmetic is passed as a scalar immediate (bound into a specialized copy of the
  Emit function, one per Emit and constants bit for bit, at most ``MAX_SPECIALIZATIONS``
  per Emit), not as a buffer: the port's
  contract gets ``scalar_view``; never where TVM's constant folding of the immediate
  would change the result or raise (``scalar_picks``);
* ``LegalizeOps`` turns each Emit function's ops into TensorIR (conv2d in blocked
  layouts through ``relax_passes.legalize_blocked_conv``, a reshape of symbolic shapes axis group
  by axis group through ``legalize_reshape``, norms and mean/variance in two passes with
  float64 sums through ``legalize_norms``) and ``FuseTIR`` merges
  it into one PrimFunc named after it (buffers declared with the default layout lose
  it first, as FuseTIR does not remap the layout's shape variables:
  ``drop_default_layouts``); ``RewriteDataflowReshape`` turns reshape
  kernels into views, so the kernel list is what runs;
* FuseTIR drops custom function attrs, so the Emit (kind, contract) is carried onto
  the PrimFunc as ``aicf.emit``, and per port the ABI it was lowered with as
  ``aicf.abi``: the buffer alignment the kernel assumes, the alignment the contract
  proves, and whether the caller must ensure it at the module boundary
  (``CompiledModel`` copies such an input only when it is under-aligned or strided).

Sound: binding a constant's value in place of a read of that constant, and TVM's
passes, preserve each function's semantics; we only add attrs.
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.tirx.layout import S, TileLayout

from aicf_tvm.core.contract import EmitContract, PortFacts
from aicf_tvm.core.emit import ABI_ATTR, EMIT_ATTR, Emit, emit_of
from aicf_tvm.core.lattice import Flag
from aicf_tvm.core.numerics import NUMERICS_ATTR, RELAXED, is_relaxed
from aicf_tvm.core.options import CompileOptions, options_or_default
from relax_passes.legalize_blocked_conv import LEGALIZE_MAP
from relax_passes.legalize_int8_matmul import LEGALIZE_MAP as MATMUL_LEGALIZE_MAP

from .group_rewrite import drop_unused_emits, with_blocks
from .legalize_norms import LEGALIZE_MAP as NORMS_LEGALIZE_MAP
from .legalize_reshape import legalize_reshape, legalize_reshape_flat_when_static

# TVM's legalization but for these ops (see each module)
_LEGALIZE = {**LEGALIZE_MAP, **MATMUL_LEGALIZE_MAP, **NORMS_LEGALIZE_MAP, "relax.reshape": legalize_reshape}
_SCALAR_OK = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.power",
              "relax.maximum", "relax.minimum"}
# TVM folds an immediate operand when it builds and simplifies TIR (arith's TryConstFold),
# for floats as for integers: x * 0 -> 0, 0 / x -> 0, x + 0 -> x, x - 0 -> x, which IEEE
# does not allow (inf * 0 is NaN, -0.0 + 0.0 is +0.0), and x / 0 raises (inside a
# schedule's compute_inline that leaves the schedule half-rewritten, and the next
# primitive aborts the process: 1 / (x * 0.0) did). max/min fold only two immediates. So
# a zero becomes an immediate only where every use is a max/min, and two immediates never
# meet in one op (that fold runs in double precision and raises when the result leaves
# the dtype's range).
_ZERO_OK = {"relax.maximum", "relax.minimum"}


def kernel_calls(func: relax.Function) -> list[str]:
    """Names of the PrimFuncs ``func`` calls through call_tir, in program order."""
    out: list[str] = []
    for block in func.body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name.startswith("relax.call_tir"):
                out.append(v.args[0].name_hint)
    return out


def scalar_immediate(expr: relax.Expr) -> tuple[tirx.Expr, tuple] | None:
    """A rank-0 float/int constant as a TIR immediate, with the key that tells constants
    apart bit for bit (dtype and bytes: -0.0 is not 0.0, a NaN is the same NaN), else None."""
    if not isinstance(expr, tvm.ir.Constant) or not isinstance(expr.ty, relax.TensorType) or expr.ty.ndim != 0:
        return None
    dtype = str(expr.ty.dtype)
    data = expr.value.numpy()
    key = (dtype, data.tobytes())
    if dtype.startswith("float"):
        return tirx.FloatImm(dtype, float(data.item())), key
    if dtype.startswith(("int", "uint")):
        return tirx.IntImm(dtype, int(data.item())), key
    return None


def _arithmetic_uses(func: relax.Function, param: relax.Var) -> list[relax.Call]:
    """The op calls that take ``param`` as a direct operand, when each is scalar-safe
    arithmetic and the param appears nowhere else; else []."""
    seen: list[int] = []
    relax.analysis.post_order_visit(func.body, lambda e: seen.append(1) if e.same_as(param) else None)
    uses = [b.value for block in func.body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and any(a.same_as(param) for a in b.value.args)]
    direct = sum(1 for v in uses for a in v.args if a.same_as(param))
    if not uses or direct != len(seen):
        return []
    if not all(isinstance(v.op, tvm.ir.Op) and v.op.name in _SCALAR_OK for v in uses):
        return []
    return uses


def scalar_picks(func: relax.Function, args: list[relax.Expr]) -> list[tuple[int, relax.Var, tirx.Expr, tuple]]:
    """(index, param, immediate, key) of each rank-0 constant argument that can be bound as
    an immediate without exposing it to one of TVM's unsound folds."""
    found = {}
    for i, (p, a) in enumerate(zip(func.params, args)):
        found_imm = scalar_immediate(a)
        uses = _arithmetic_uses(func, p) if found_imm is not None else []
        if not uses:
            continue
        if found_imm[0].value == 0 and any(v.op.name not in _ZERO_OK for v in uses):
            continue  # -0.0 too
        found[i] = (p, found_imm, uses)
    together = {i for i, (_, _, uses) in found.items() for v in uses
                if sum(any(a.same_as(q) for a in v.args) for q, _, _ in found.values()) > 1}
    return [(i, p, imm, key) for i, (p, (imm, key), _) in found.items() if i not in together]


# Specializations of one Emit function at most: beyond, its calls pass their rank-0
# constants as buffers and share one kernel. A QDQ model's every layer has its own
# quantization scales: BERT-base's 72 quantized matmuls made 12x the kernels to schedule
# and compile (45 s), for an immediate that saves one scalar load per kernel call.
MAX_SPECIALIZATIONS = 4


def bind_scalar_ports(mod: tvm.IRModule) -> tvm.IRModule:
    """Specialize Emit functions so rank-0 constant ports become scalar immediates; calls
    with the same constants, bit for bit, share one specialization; an Emit function
    called with more than ``MAX_SPECIALIZATIONS`` sets of constants is not specialized."""
    bb = relax.BlockBuilder(mod)
    main = mod["main"]
    specialized: dict[tuple, relax.GlobalVar] = {}
    planned: dict[tuple[int, int], tuple] = {}  # (block, binding) -> (func, emit, picks, key)
    keys: dict[str, set] = {}
    for bi, block in enumerate(main.body.blocks):
        for ji, b in enumerate(block.bindings):
            v = b.value
            func = mod[v.op] if isinstance(v, relax.Call) and isinstance(v.op, relax.GlobalVar) else None
            emit = emit_of(func) if isinstance(func, relax.Function) else None
            picks = scalar_picks(func, list(v.args)) if emit is not None else []
            if picks:
                key = (v.op.name_hint, tuple((i, k) for i, _, _, k in picks))
                planned[bi, ji] = (func, emit, picks, key)
                keys.setdefault(v.op.name_hint, set()).add(key)
    blocks, changed = [], False
    for bi, block in enumerate(main.body.blocks):
        bindings = []
        for ji, b in enumerate(block.bindings):
            v = b.value
            plan = planned.get((bi, ji))
            if plan is None or len(keys[v.op.name_hint]) > MAX_SPECIALIZATIONS:
                bindings.append(b)
                continue
            func, emit, picks, key = plan
            if key not in specialized:
                bound = func.bind_params({p: relax.prim_value(imm) for _, p, imm, _ in picks})
                ports = [emit.interface.inputs[i].name for i, _, _, _ in picks]
                provides = emit.contract.provides
                for port in ports:
                    f = provides.port(port)
                    abi = type(f.abi)(f.abi.alignment, Flag.of(True), f.abi.contiguous)
                    provides = provides.with_port(port, PortFacts(f.effect, f.shape, f.numeric, abi))
                new_emit = emit.with_contract(EmitContract(emit.contract.requires, provides))
                bound = bound.with_attr(EMIT_ATTR, new_emit.to_attr()).with_attr("aicf.scalar_ports", ports)
                specialized[key] = bb.add_func(bb.normalize(bound), f"{v.op.name_hint}_scalar")
            keep = [a for i, a in enumerate(v.args) if i not in {i for i, _, _, _ in picks}]
            bindings.append(relax.VarBinding(b.var, bb.normalize(relax.Call(specialized[key], keep))))
            changed = True
        blocks.append(type(block)(bindings) if isinstance(block, relax.DataflowBlock) else block)
    if not changed:
        return mod
    with_blocks(bb, mod, "main", blocks)
    return drop_unused_emits(bb.get())


def abi_of(func: tirx.PrimFunc, emit: Emit, scalars: list[str]) -> list[dict]:
    """Per PrimFunc buffer parameter: port, the alignment the kernel assumes and the one
    proven. A scalar parameter (a symbolic var of the caller FuseTIR made of a group's
    ``tir_vars``, an int64) is no port."""
    ports = [p for p in emit.interface.inputs if p.name not in scalars] + list(emit.interface.outputs)
    buffers = [p for p in func.params if isinstance(p.ty, tirx.BufferType)]
    out = []
    for param, port in zip(buffers, ports):
        ty = param.ty
        assumed = int(getattr(ty, "data_alignment", 1) or 1)
        facts = emit.contract.provides.port(port.name).abi
        proven = facts.alignment.bytes
        out.append({"port": port.name, "align": assumed, "proven": proven,
                    "contiguous": bool(facts.contiguous), "boundary_check": proven < assumed})
    for name in scalars:
        out.append({"port": name, "scalar": True})
    return out


def _without_default_layout(ty: tirx.BufferType) -> tirx.BufferType:
    """``ty`` without its layout when that is the compact row-major one of its own shape
    (what a buffer without a layout means too)."""
    if ty.layout is None or not ty.shape or ty.strides:
        return ty
    if not tvm_ffi.structural_equal(ty.layout, TileLayout(S[tuple(ty.shape)])):
        return ty
    return tirx._ffi_api.BufferType(ty.storage_scope, ty.dtype, ty.shape, ty.strides, ty.elem_offset,
                                    ty.data_alignment, ty.offset_factor, None, ty.allocated_addr, ty.span)


def drop_default_layouts(mod: tvm.IRModule) -> tvm.IRModule:
    """PrimFuncs whose buffers carry the default (compact row-major) ``TileLayout`` get
    buffers without one, which mean the same storage.

    Python's ``decl_buffer`` gives every buffer that layout (TOPI's cumsum, cumprod and
    sort kernels), TE's buffers have none. FuseTIR substitutes a callee's shape variables
    in a buffer's shape but not in its layout, so a fused scan over a symbolic dim kept
    the callee's variable: undefined in the fused kernel ("not passed in as API
    arguments")."""
    for gv, func in list(mod.functions_items()):
        if isinstance(func, tirx.PrimFunc):
            mod[gv] = tvm_ffi.structural_map(func, [(tirx.BufferType, _without_default_layout)])
    return mod


_FUSABLE = ("relax.call_tir", "relax.call_tir_inplace")


def _demote_unfusable(mod: tvm.IRModule) -> tvm.IRModule:
    """Drop ``Primitive`` from Emit functions whose body calls anything but call_tir after
    legalization (FuseTIR accepts only those); the VM then calls them as functions."""
    for gv, func in list(mod.functions_items()):
        if not isinstance(func, relax.Function) or func.attrs is None or "Primitive" not in func.attrs:
            continue
        calls: list = []
        relax.analysis.post_order_visit(
            func.body,
            lambda e, calls=calls: (calls.append(e) if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op)
                                    else None))
        if any(c.op.name not in _FUSABLE for c in calls):
            mod[gv] = func.without_attr("Primitive")
    return mod


@tvm.transform.module_pass(opt_level=0, name="LowerEmits")
class LowerEmits:
    """Bind scalar ports, then legalize and fuse each Emit function into a PrimFunc, for
    ``options.target`` (sort and scan ops dispatch per target), else the enclosing
    ``with target:``; ``options.static_reshapes_by_group`` picks the reshape legalization."""

    def __init__(self, options: CompileOptions | None = None) -> None:
        self.options = options_or_default(options)

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        target = self.options.target
        if target is None:
            return self._lower(mod)
        with tvm.target.Target(target) if isinstance(target, str) else target:
            return self._lower(mod)

    def _lower(self, mod: tvm.IRModule) -> tvm.IRModule:
        if "main" in [gv.name_hint for gv in mod.get_global_vars()]:
            mod = bind_scalar_ports(mod)
        emits: dict[str, tuple[Emit, list[str], bool]] = {}
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                emit = emit_of(func)
                if emit is not None:
                    scalars = ([str(s) for s in func.attrs["aicf.scalar_ports"]]
                               if "aicf.scalar_ports" in func.attrs else [])
                    emits[gv.name_hint] = (emit, scalars, is_relaxed(func))
        # Sort/scan/sampling ops lower through TVM's dispatchers (the target's
        # implementation); an Emit whose ops still do not all become call_tir (an extern
        # sort) stays a plain Relax function the VM calls, not a fused kernel.
        # RewriteDataflowReshape turns reshape-pattern kernels into views (no kernel runs);
        # the backend runs it too, but here the kernel list reflects what really runs.
        from tvm.relax import backend

        mod = tvm.transform.Sequential([backend.DispatchSampling(), backend.DispatchSortScan(),
                                        relax.transform.LegalizeOps(self._legalize())])(mod)
        mod = tvm.transform.Sequential([relax.transform.FuseTIR(), relax.transform.RewriteDataflowReshape()])(
            _demote_unfusable(drop_default_layouts(mod)))
        for gv, func in list(mod.functions_items()):
            found = emits.get(gv.name_hint)
            if isinstance(func, tirx.PrimFunc) and found is not None:
                emit, scalars, relaxed = found
                func = func.with_attr(EMIT_ATTR, emit.to_attr()).with_attr("aicf.kind", emit.kind)
                if relaxed:  # the numeric level the rules and VectorizeMath read (RelaxNumerics)
                    func = func.with_attr(NUMERICS_ATTR, RELAXED)
                mod[gv] = func.with_attr(ABI_ATTR, abi_of(func, emit, scalars))
        return mod

    def _legalize(self) -> dict:
        if self.options.static_reshapes_by_group:
            return _LEGALIZE
        return {**_LEGALIZE, "relax.reshape": legalize_reshape_flat_when_static}


__all__ = ["LowerEmits", "abi_of", "bind_scalar_ports", "drop_default_layouts", "kernel_calls", "np"]
