"""Two compiled Relax modules as one: ``merge_functions``.

A library may serve several entry functions that share weights (a causal LM's prefill
step and its one-token decode step, ``aicf_tvm.driver.llm``). Each is compiled from its
own module; merging adds the other module's ``main`` under a new name and its kernels
under ``<name>_<kernel>``, and makes every constant of it that equals one of the base
module (same dtype, shape and bytes) that very constant: the VM's executable stores an
object once, so the library and the loaded process hold one copy of each weight.

Sound: renaming changes no computation (every reference is renamed with its function),
and a constant is replaced only by one with the same bytes.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator


def _key(const: tvm.ir.expr.GenericConst) -> tuple:
    data = const.value.numpy()
    return str(data.dtype), data.shape, hashlib.sha1(np.ascontiguousarray(data).tobytes()).hexdigest()


class _Keys(dict):
    """``_key`` of each constant object, computed once (a weight appears in many calls,
    and hashing copies its bytes out)."""

    def __missing__(self, const: tvm.ir.expr.GenericConst) -> tuple:
        key = self[const] = _key(const)
        return key


def _nbytes(key: tuple) -> int:
    dtype, shape, _ = key
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


class Merged(NamedTuple):
    """``merge_functions``' module, and the bytes of the added function's distinct
    constants: those now the base module's objects (stored once), and its own."""

    module: tvm.IRModule
    shared_bytes: int
    own_bytes: int


def constants_of(func: relax.Function) -> list[tvm.ir.expr.GenericConst]:
    """Every constant ``func`` holds, in post order (one per occurrence)."""
    out: list[tvm.ir.expr.GenericConst] = []
    relax.analysis.post_order_visit(func, lambda e: out.append(e) if isinstance(e, tvm.ir.expr.GenericConst) else None)
    return out


@mutator
class _Rewriter(PyExprMutator):
    """References renamed, constants replaced by their equals of the base module."""

    def __init__(self, renamed: dict[str, tvm.ir.GlobalVar], shared: dict[tuple, tvm.ir.expr.GenericConst],
                 keys: _Keys) -> None:
        super().__init__()
        self.renamed, self.shared, self.keys = renamed, shared, keys
        self.seen: dict[tuple, bool] = {}  # each distinct constant: whether the base has it

    def visit_global_var_(self, op: tvm.ir.GlobalVar) -> relax.Expr:
        return self.renamed.get(op.name_hint, op)

    def visit_generic_const_(self, op: tvm.ir.expr.GenericConst) -> relax.Expr:
        key = self.keys[op]
        self.seen[key] = key in self.shared
        return self.shared.get(key, op)


def merge_functions(base: tvm.IRModule, other: tvm.IRModule, name: str) -> Merged:
    """``base`` plus ``other``'s ``main`` as ``name`` and its other functions as
    ``<name>_<function>`` (module docstring), with the bytes of ``other``'s constants
    it shares with ``base`` and of those it does not."""
    taken = {gv.name_hint for gv in base.get_global_vars()}
    if name in taken:
        raise ValueError(f"merge_functions: the base module already has a function {name!r}")
    keys = _Keys()
    shared = {keys[c]: c for f in base.functions.values() if isinstance(f, relax.Function) for c in constants_of(f)}
    bb = relax.BlockBuilder(base)
    renamed: dict[str, tvm.ir.GlobalVar] = {}
    rewriter = _Rewriter(renamed, shared, keys)
    # kernels first, then the Relax functions that call them, ``main`` last
    items = sorted(other.functions_items(), key=lambda kv: (isinstance(kv[1], relax.Function),
                                                           kv[0].name_hint == "main"))
    for gv, func in items:
        new = name if gv.name_hint == "main" else f"{name}_{gv.name_hint}"
        if new in taken:
            raise ValueError(f"merge_functions: {new!r} is in both modules")
        if isinstance(func, relax.Function):
            func = rewriter.visit_expr(func)
        elif not isinstance(func, tirx.PrimFunc):
            raise TypeError(f"merge_functions: {gv.name_hint} is neither a Relax function nor a PrimFunc")
        if func.attrs is not None and "global_symbol" in func.attrs:
            func = func.with_attr("global_symbol", new)
        renamed[gv.name_hint] = bb.add_func(func, new)
    shared_bytes = sum(_nbytes(key) for key, shared in rewriter.seen.items() if shared)
    own_bytes = sum(_nbytes(key) for key, shared in rewriter.seen.items() if not shared)
    return Merged(bb.get(), shared_bytes, own_bytes)


__all__ = ["Merged", "constants_of", "merge_functions"]
