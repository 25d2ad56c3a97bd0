"""verify_contracts: check every invariant of the ``aicf.emit`` annotations.

For each Emit function: the annotation decodes; the function is ``Primitive``; the
interface matches the parameters and the return type (count, dtype, rank), but for a
last ``tir_vars`` shape parameter (``relax_passes.group_rewrite``), which is no port; every shape
fact is consistent with the Relax type (their meet is not ⊥) and at least as strong
as what the type proves (ranks and static extents: symbolic ones are the caller's in the
facts and the function's own in the type); the effects are those of the kind's template (never weaker
claims: an opaque Emit keeps ReadWrite); alias facts name real ports. Runs after
every pass in tests, and under ``AICF_DEBUG=1`` in the pipeline.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from aicf_tvm import library
from aicf_tvm.core.emit import EMIT_ATTR, Emit
from aicf_tvm.core.errors import AicfError, ContractViolation
from aicf_tvm.core.kinds.describe import output_types, type_shape
from aicf_tvm.core.kinds.registry import kinds_by_name
from aicf_tvm.core.lattice import Effect, ShapeFact


def _static_part(fact: ShapeFact) -> ShapeFact:
    """A function's type shape with its symbolic dims unknown: the facts are its call
    sites' and speak of the caller's vars (``batch * seq``), the type of the function's
    own (``d0``), so only ranks and static extents compare."""
    if fact.dims is None:
        return fact
    return ShapeFact(tuple(d if isinstance(d, int) else None for d in fact.dims))


def _problems_of(name: str, func: relax.Function, emit: Emit, known_kinds: set[str]) -> list[str]:
    out: list[str] = []
    where = f"Emit {name} ({emit.kind})"
    if func.attrs is None or "Primitive" not in func.attrs:
        out.append(f"{where}: function is not marked Primitive")
    if emit.kind not in known_kinds:
        out.append(f"{where}: unknown kind")
    params = [p for p in func.params if isinstance(p.ty, relax.TensorType)]
    for i, p in enumerate(func.params):
        last_shape = i == len(func.params) - 1 and isinstance(p.ty, relax.ShapeType)
        if not isinstance(p.ty, relax.TensorType) and not last_shape:
            out.append(f"{where}: param {p.name} is neither a tensor port nor the last, tir_vars shape")
    if len(params) != len(emit.interface.inputs):
        out.append(f"{where}: {len(emit.interface.inputs)} input ports but {len(params)} tensor params")
    pairs: list[tuple[Any, Any]] = list(zip(emit.interface.inputs, [p.ty for p in params]))
    outs = output_types(func.ret_ty)
    if len(outs) != len(emit.interface.outputs):
        out.append(f"{where}: {len(emit.interface.outputs)} output ports but {len(outs)} results")
    pairs += list(zip(emit.interface.outputs, [t for _, t in outs]))
    provides = emit.contract.provides
    for port, ty in pairs:
        if not isinstance(ty, relax.TensorType):
            out.append(f"{where}: port {port.name} is not a tensor")
            continue
        if str(ty.dtype) != port.dtype or (ty.ndim >= 0 and ty.ndim != port.ndim):
            out.append(f"{where}: port {port.name} declared {port.dtype}/rank {port.ndim}, "
                       f"type is {ty.dtype}/rank {ty.ndim}")
        fact, typed = provides.port(port.name).shape, _static_part(type_shape(ty))
        if fact.meet(typed).is_bottom:
            out.append(f"{where}: port {port.name} shape {fact.show()} contradicts type {typed.show()}")
        elif not fact.leq(typed):
            out.append(f"{where}: port {port.name} shape {fact.show()} is weaker than type {typed.show()}")
    names = set(emit.interface.port_names())
    input_names = {p.name for p in emit.interface.inputs}
    for name_, facts in provides.ports:
        if name_ not in names:
            out.append(f"{where}: facts for unknown port {name_}")
        elif emit.kind == "opaque" and facts.effect != Effect.top():
            out.append(f"{where}: opaque port {name_} claims effect {facts.effect.value}")
        elif name_ not in input_names and not facts.effect.writes:
            out.append(f"{where}: output port {name_} claims effect {facts.effect.value} (must write)")
    for (a, b), fact in provides.alias:
        if a not in names or b not in names:
            out.append(f"{where}: alias fact over unknown ports ({a}, {b})")
        if fact.value == "Contradiction":
            out.append(f"{where}: alias({a}, {b}) is ⊥")
    return out


def contract_problems(mod: tvm.IRModule) -> list[str]:
    """Every broken invariant in ``mod``'s Emit annotations (empty when all hold)."""
    known = set(kinds_by_name()) | set(library.library_kinds())
    problems: list[str] = []
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or func.attrs is None or EMIT_ATTR not in func.attrs:
            continue
        try:
            emit = Emit.from_attr(func.attrs[EMIT_ATTR])
        except AicfError as err:
            problems.append(f"Emit {gv.name_hint}: {err}")
            continue
        problems.extend(_problems_of(gv.name_hint, func, emit, known))
    return problems


def verify_contracts(mod: tvm.IRModule) -> None:
    """Raise ``ContractViolation`` listing every broken invariant; also run Relax's own check."""
    problems = contract_problems(mod)
    if not relax.analysis.check_well_formed(mod):
        problems.append("module is not well formed (relax.analysis.well_formed)")
    if problems:
        raise ContractViolation("; ".join(problems))
