"""The ``cache_write`` kind: rows written into a caller's buffer in place (a KV cache).

``slice_scatter(cache, rows, start, end, axis)`` is, as Relax defines it, a new tensor:
the cache with ``rows`` over ``[start, end)`` of ``axis``. When the caller donates the
cache (the function's ``aicf.donated_inputs`` attr names the parameter: the caller never
reads its old value again) and nothing else in the function reads it, the new tensor
may be the cache itself with only the rows written: the Emit's contract says so with
effects and aliasing (docs/design.md §3): ``cache`` = ReadWrite, ``rows`` = Read, and the
output MustAlias ``cache``. ``relax_passes.cache_in_place`` proves those facts and lowers
the Emit to ``call_tir_inplace`` of ``cache_write_kernel``; the bytes it writes are the
rows', not the cache's.
"""

from __future__ import annotations

from collections.abc import Sequence

from tvm import relax, tirx

from ..contract import ContractFacts, EmitContract, PortFacts
from ..emit import Emit, Interface, Port
from ..kinds.describe import type_shape
from ..lattice import MUST_ALIAS, READ, READWRITE, WRITE, NumericFact

KIND = "cache_write"
# Function attr: the parameters (by name) whose buffers the caller hands over, never
# reading their old values after the call; an Emit may then write them in place.
DONATED_INPUTS_ATTR = "aicf.donated_inputs"


def cache_write_emit(cache_ty: relax.TensorType, rows_ty: relax.TensorType, axis: int) -> Emit:
    """The Emit of one in-place write (module docstring)."""
    dtype = str(cache_ty.dtype)
    ndim = int(cache_ty.ndim)
    inputs = (Port("cache", dtype, ndim), Port("rows", dtype, ndim))
    outputs = (Port("out.0", dtype, ndim),)
    provides = {"cache": PortFacts(effect=READWRITE, shape=type_shape(cache_ty)),
                "rows": PortFacts(effect=READ, shape=type_shape(rows_ty)),
                "out.0": PortFacts(effect=WRITE, shape=type_shape(cache_ty), numeric=NumericFact.exact(dtype))}
    contract = EmitContract(provides=ContractFacts.of(provides, {("cache", "out.0"): MUST_ALIAS}))
    return Emit(KIND, {"axis": axis}, Interface(inputs, outputs), contract)


def _symbolic(dims: Sequence[tirx.Expr], prefix: str) -> list[tirx.Expr]:
    """``dims`` with every non-constant extent a fresh var of the kernel's own."""
    return [d if isinstance(d, (int, tirx.IntImm)) else tirx.Var(f"{prefix}{k}", "int64") for k, d in enumerate(dims)]


def cache_write_kernel(cache_dims: Sequence[tirx.Expr], rows_dims: Sequence[tirx.Expr], axis: int,
                       dtype: str) -> tirx.PrimFunc:
    """``cache[..., start + i, ...] = rows[..., i, ...]`` for every element of ``rows``;
    params (cache, rows, start): ``start`` comes as ``call_tir_inplace``'s ``tir_vars``.
    The caller has checked ``0 <= start`` and ``start + rows.shape[axis] <= cache.shape[axis]``
    (the function's shape requirements, ``relax_passes.shape_rules``)."""
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    cache_shape, rows_shape = _symbolic(cache_dims, "c"), _symbolic(rows_dims, "r")
    with IRBuilder() as ib, T.prim_func():
        T.func_name(KIND)
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        cache = T.arg("cache", T.Buffer(cache_shape, dtype))
        rows = T.arg("rows", T.Buffer(rows_shape, dtype))
        start = T.arg("start", T.int64())
        with T.grid(*rows_shape) as idx:  # a few rows: one thread writes them
            idx = [idx] if len(rows_shape) == 1 else list(idx)
            at = list(idx)
            at[axis] = idx[axis] + start
            T.buffer_store(cache, rows[tuple(idx)], at)
    return ib.get()


__all__ = ["DONATED_INPUTS_ATTR", "KIND", "cache_write_emit", "cache_write_kernel"]
