"""A fresh buffer's zeroing as one flat loop, which LLVM makes one ``memset``.

A GEMM's C workspace (``decompose_reduction``'s init, under the register tile's loops)
is zeroed by a nest of the tile's shape: BERT's 128 x 384 chunk by 2 x 6 x 16 iterations
of 16 vector stores each. LLVM unrolls such a nest whole and then works on 3072 stores
(386 ``memset`` calls after it merged them): 0.9-2.2 s of machine code generation for
each of BERT's four GEMM kernels, 4.2 of the 4.7 s its JIT took, where the same kernel
with a one-iteration strip took 0.09 s.

``FlatZeroFill`` finds, in a sequence, a buffer's allocation followed at once by a loop
nest that only stores a zero (+0.0, as every bit clear, or an integer 0, as scalar or
broadcast) into that buffer, as many stores as the buffer has elements, with no other
effect (loops of constant extent, index bindings); it replaces the nest by one serial
loop storing the same zero to every element in order. Sound: the buffer was just
allocated, so nothing it held before can be read; every element the nest zeroed is zero
after the loop, and an element it did not zero (there is none where the counts match,
unless the nest wrote one twice) was undefined and is now zero. The same bytes, written
once each. It runs on lowered TIR, in ``parallel_guard.tir_pipeline``.
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import tirx
from tvm.target import Target

from .common import static_extent
from .llvm_pass import llvm_prim_func_pass


def _is_zero(value: tirx.Expr) -> bool:
    """+0.0 or integer 0, scalar or broadcast (every bit clear)."""
    if isinstance(value, tirx.Broadcast):
        value = value.value
    if isinstance(value, tirx.FloatImm):
        return value.value == 0.0 and math.copysign(1.0, value.value) > 0  # not -0.0
    return isinstance(value, tirx.IntImm) and value.value == 0


def _zero_stores(stmt: tirx.Stmt, buffer: tirx.Buffer) -> tuple[int, tirx.Expr] | None:
    """(how many stores, the stored zero) when ``stmt`` only stores one zero into
    ``buffer`` (loops of constant extent, index bindings), else None."""
    if isinstance(stmt, tirx.BufferStore):
        if not stmt.buffer.same_as(buffer) or not _is_zero(stmt.value):
            return None
        return 1, stmt.value
    if isinstance(stmt, tirx.For):
        extent = static_extent(stmt.extent)
        inner = _zero_stores(stmt.body, buffer)
        if extent is None or inner is None or int(stmt.kind) == int(tirx.ForKind.PARALLEL):
            return None
        return extent * inner[0], inner[1]
    if isinstance(stmt, tirx.SeqStmt):
        count, zero = 0, None
        for part in stmt.seq:
            if isinstance(part, tirx.Bind):
                continue
            found = _zero_stores(part, buffer)
            if found is None or (zero is not None and not tvm_ffi.structural_equal(found[1], zero)):
                return None
            count, zero = count + found[0], found[1]
        return (count, zero) if zero is not None else None
    return None


def _flat_fill(seq: tirx.SeqStmt) -> tirx.Stmt:
    parts = list(seq.seq)
    changed = False
    for at in range(len(parts) - 1):
        alloc = parts[at]
        if not isinstance(alloc, tirx.AllocBuffer) or len(alloc.buffer.shape) != 1:
            continue
        size = static_extent(alloc.buffer.shape[0])
        found = _zero_stores(parts[at + 1], alloc.buffer)
        if size is None or found is None or found[0] != size:
            continue
        dtype = str(alloc.buffer.shape[0].ty.dtype)
        index = tirx.Var("zero_fill", dtype)
        parts[at + 1] = tirx.For(index, tirx.IntImm(dtype, 0), tirx.IntImm(dtype, size), tirx.ForKind.SERIAL,
                                 tirx.BufferStore(alloc.buffer, found[1], [index]))
        changed = True
    return tirx.SeqStmt(parts) if changed else seq


def flat_zero_fill(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each fresh buffer's zeroing nest made one flat loop (module docstring)."""
    return tvm_ffi.structural_map(func, [(tirx.SeqStmt, _flat_fill)])


def FlatZeroFill(target: Target | None = None) -> tvm.transform.Pass:
    """PrimFunc pass applying ``flat_zero_fill`` to the PrimFuncs compiled for an LLVM
    target (the PrimFunc's ``target`` attr, else ``target``, else ``with target:``)."""
    return llvm_prim_func_pass(flat_zero_fill, target, "FlatZeroFill")
