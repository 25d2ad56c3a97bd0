"""Blocks that store an immediate, and how a schedule keeps TVM from folding them.

TVM folds an immediate operand whenever it rebuilds or simplifies TIR (arith's
``TryConstFold``), for floats as for integers: ``x + 0.0 -> x`` (IEEE: -0.0 + 0.0 is
+0.0), ``x * 0.0 -> 0`` (inf * 0 is NaN), ``0.0 / x -> 0``, and ``x / 0`` raises.  A
block that only stores an immediate (``t[i] = 0.0``) is harmless until a schedule inlines
it: ``compute_inline`` of that block, or ``reverse_compute_inline`` of a consumer into
it, puts the immediate in front of the folder, which then changes the result or raises
inside the primitive.  A primitive that raises there leaves the schedule half-rewritten,
and the next primitive on it aborts the process with an uncatchable C++ ``terminate``
(dlight's ``try_inline`` swallows the first error and tries the next block).

Our CPU rules never inline across such a block (``inlines_a_constant``).  dlight's GPU rules
inline what they can, so they get the function with each such immediate written as
``reinterpret(dtype, bits)`` (``opaque_constant_stores``): the same value bit for bit,
which TVM's folder does not look into and NVCC folds exactly.  (LLVM code generation
refuses a reinterpret of a zero literal, so this is not for CPU targets.)  Reduction
inits keep their immediates: reducers are recognized by them.
"""

from __future__ import annotations

import re
import struct

import tvm_ffi
from tvm import s_tir, tirx

_FLOAT_FORMATS = {"float16": "<e", "float32": "<f", "float64": "<d"}


def stored_constant(block: s_tir.SBlock) -> tirx.Expr | None:
    """The immediate a spatial block without init stores, else None. A bool immediate is
    not one: folding ``True and c`` to ``c`` is exact, and leaving it stored would make the
    rules vectorize a bool buffer, which LLVM code generation mistypes (i8 vs i1)."""
    body = block.body
    if block.init is not None or not isinstance(body, tirx.BufferStore):
        return None
    if not all(int(iv.iter_type) == tirx.IterVar.DataPar for iv in block.iter_vars):
        return None
    value = body.value
    if not isinstance(value, (tirx.FloatImm, tirx.IntImm)) or str(value.ty) == "bool":
        return None
    return value


def inlines_a_constant(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, reverse: bool) -> bool:
    """Whether ``compute_inline(block)`` (``reverse``: ``reverse_compute_inline``) would
    substitute a stored immediate into another block."""
    if not reverse:
        return stored_constant(sch.get(block)) is not None
    return any(stored_constant(sch.get(p)) is not None for p in sch.get_producers(block))


def opaque_immediate(imm: tirx.Expr) -> tirx.Expr | None:
    """``imm`` as a reinterpret of its bits, or None for a dtype without a plain encoding
    (bool, bfloat16, float8: left as they are)."""
    dtype = str(imm.ty)
    if dtype in _FLOAT_FORMATS:
        packed = struct.pack(_FLOAT_FORMATS[dtype], imm.value)
        width, bits = 8 * len(packed), int.from_bytes(packed, "little")
    elif (m := re.fullmatch(r"u?int(8|16|32|64)", dtype)) is not None:
        width = int(m.group(1))
        bits = int(imm.value) & ((1 << width) - 1)
    else:
        return None
    if dtype.startswith("uint"):  # a reinterpret to its own dtype would fold away
        return tirx.reinterpret(dtype, tirx.const(bits - (bits >> (width - 1) << width), f"int{width}"))
    return tirx.reinterpret(dtype, tirx.const(bits, f"uint{width}"))


def _shielded(block: s_tir.SBlock) -> s_tir.SBlock:
    imm = stored_constant(block)
    opaque = opaque_immediate(imm) if imm is not None else None
    if opaque is None:
        return block
    store = block.body
    return s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint,
                        tirx.BufferStore(store.buffer, opaque, store.indices), None,
                        block.alloc_buffers, block.match_buffers, block.annotations)


def opaque_constant_stores(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every constant store's immediate hidden from TVM's folder."""
    return tvm_ffi.structural_map(func, (s_tir.SBlock, _shielded))
