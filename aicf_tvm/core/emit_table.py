"""The Emit call sites of a function, and their table: kind, ports, contract facts.

What ``aicf explain`` prints and what an exported library carries (``aicf_tvm.runtime.deploy``).
"""

from __future__ import annotations

import tvm
from tvm import relax

from .emit import Emit, Port, emit_of
from .emit_graph import tir_vars_arg


def emit_calls(mod: tvm.IRModule, name: str = "main") -> list[tuple[relax.Var, relax.GlobalVar, Emit]]:
    """The Emit call sites of ``name`` in program order: (bound var, callee, Emit)."""
    out = []
    cache: dict = {}
    for block in mod[name].body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and isinstance(v.op, relax.GlobalVar):
                if v.op not in cache:
                    cache[v.op] = emit_of(mod[v.op]) if isinstance(mod[v.op], relax.Function) else None
                if cache[v.op] is not None:
                    out.append((b.var, v.op, cache[v.op]))
    return out


def _port_text(emit: Emit, port: Port) -> str:
    f = emit.contract.provides.port(port.name)
    bits = [f"{port.name}:{port.dtype}{f.shape.show()}", f.effect.value]
    if f.abi.alignment.bytes > 1:
        bits.append(f.abi.alignment.show())
    return " ".join(bits)


def _numeric_text(emit: Emit) -> str:
    if not emit.interface.outputs:
        return ""
    n = emit.contract.provides.port(emit.interface.outputs[0].name).numeric
    return f"{n.math.value}/{n.accumulation.value}/{n.determinism.value[:3]}/{n.rounding.value}"


def emit_table(mod: tvm.IRModule) -> str:
    rows = [("#", "value", "Emit", "kind", "ports (dtype, shape/strides, effect)", "numeric")]
    calls = emit_calls(mod)
    values = {b.var: b.value for block in mod["main"].body.blocks for b in block.bindings}
    for i, (var, gv, emit) in enumerate(calls):
        ports = "; ".join(_port_text(emit, p) for p in emit.interface.inputs + emit.interface.outputs)
        shape = tir_vars_arg(values[var])
        if shape is not None:  # the caller's symbolic vars the Emit takes besides its ports
            ports += "; tir_vars: " + ", ".join(str(d) for d in shape.values)
        rows.append((str(i), var.name, gv.name_hint, emit.kind, ports, _numeric_text(emit)))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]) - 2)]
    lines = []
    for r in rows:
        head = "  ".join(cell.ljust(w) for cell, w in zip(r[:-2], widths))
        lines.append(f"{head}  {r[-2]}  [{r[-1]}]" if r[-1] else f"{head}  {r[-2]}")
    opaque = [(var.name, emit.op) for var, _, emit in calls if emit.kind == "opaque"]
    kinds: dict[str, int] = {}
    for _, _, emit in calls:
        kinds[emit.kind] = kinds.get(emit.kind, 0) + 1
    lines.append("")
    lines.append(f"{len(calls)} Emits: " + ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())))
    lines.append(f"opaque Emits: {len(opaque)}" + "".join(f"\n  {v} <- {op}" for v, op in opaque))
    return "\n".join(lines)
