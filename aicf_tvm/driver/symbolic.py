"""Symbolic dims from ``torch.export``: keep the names the user gave them.

``torch.export`` renames every dynamic dimension to a fresh symbol (``s27``); TVM's frontend
keeps that name for the ``tirx.Var`` and for the ``tir_var_*_bound`` attrs. The user said
``Dim("seq", max=512)``, so errors and specs should say ``seq``: this maps each symbol back
to the ``Dim`` of the first example argument that carries it and renames the var and the
bounds. A symbol that no ``Dim`` names (derived dims such as ``2*seq`` are expressions, not
symbols) keeps torch's name. ``with_dim_bounds`` sets the bounds of symbolic dims the
user gives by name (``--dim``, ``bounds=``) on any imported model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import tvm
from tvm import relax, tirx

from aicf_tvm.core.errors import InputError

if TYPE_CHECKING:
    import torch


def torch_dim_names(ep: torch.export.ExportedProgram, dynamic_shapes: Any) -> dict[str, str]:
    """``{torch symbol: Dim name}`` for the user inputs of an ExportedProgram."""
    if dynamic_shapes is None:
        return {}
    specs = list(dynamic_shapes.values()) if isinstance(dynamic_shapes, Mapping) else list(dynamic_shapes)
    user = list(ep.graph_signature.user_inputs)
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    out: dict[str, str] = {}
    for name, spec in zip(user, specs):
        node = nodes.get(name)
        val = node.meta.get("val") if node is not None else None
        if val is None or not spec:
            continue
        items = spec.items() if isinstance(spec, Mapping) else enumerate(spec)
        for axis, dim in items:
            label = getattr(dim, "__name__", None)
            if label is None or axis >= len(val.shape):
                continue
            symbol = str(val.shape[axis])
            if symbol.isidentifier():
                out.setdefault(symbol, label)
    return out


def rename_dims(mod: tvm.IRModule, names: Mapping[str, str]) -> tvm.IRModule:
    """``mod`` with main's symbolic vars and their bounds renamed by ``names``."""
    if not names:
        return mod
    func = mod["main"]
    taken = {v.name for v in relax.analysis.defined_symbolic_vars(func)}
    mapping: dict[Any, Any] = {}
    renamed: dict[str, str] = {}
    for var in relax.analysis.defined_symbolic_vars(func):
        new = names.get(var.name)
        if new and new != var.name and new not in taken and new not in renamed.values():
            mapping[var] = tirx.Var(new, "int64")
            renamed[var.name] = new
    if not mapping:
        return mod
    func = func.bind_symbolic_vars(mapping)
    attrs = dict(func.attrs) if func.attrs is not None else {}
    for key in ("tir_var_lower_bound", "tir_var_upper_bound"):
        if key in attrs:
            func = func.with_attr(key, {renamed.get(str(k), str(k)): int(v) for k, v in dict(attrs[key]).items()})
    out = mod.shallow_copy() if hasattr(mod, "shallow_copy") else mod
    out["main"] = func
    return out


def with_dim_bounds(mod: tvm.IRModule, bounds: Mapping[str, tuple[int | None, int | None]]) -> tvm.IRModule:
    """``mod`` with ``bounds`` (``{dim: (lower, upper)}``, None for no bound) on main's
    symbolic dims as the ``tir_var_*_bound`` attrs ``torch.export`` gives, merged with
    those already there: ``BoundShapes`` simplifies under them, the compiled model checks
    them at every call. A name that is no symbolic dim of main is an error naming the
    dims there are."""
    if not bounds:
        return mod
    func = mod["main"]
    dims = sorted({v.name for v in relax.analysis.defined_symbolic_vars(func)})
    attrs = dict(func.attrs) if func.attrs is not None else {}
    merged = {key: {str(k): int(v) for k, v in dict(attrs.get(key, {})).items()}
              for key in ("tir_var_lower_bound", "tir_var_upper_bound")}
    for dim, (low, high) in bounds.items():
        if dim not in dims:
            raise InputError(f"dim {dim}: not a symbolic dim of the model ("
                             f"{'its symbolic dims are: ' + ', '.join(dims) if dims else 'it has none'})")
        if low is not None and high is not None and low > high:
            raise InputError(f"dim {dim}: lower bound {low} is above the upper bound {high}")
        if low is not None:
            merged["tir_var_lower_bound"][dim] = int(low)
        if high is not None:
            merged["tir_var_upper_bound"][dim] = int(high)
    for key, values in merged.items():
        if values:
            func = func.with_attr(key, values)
    out = mod.shallow_copy() if hasattr(mod, "shallow_copy") else mod
    out["main"] = func
    return out


__all__ = ["rename_dims", "torch_dim_names", "with_dim_bounds"]
