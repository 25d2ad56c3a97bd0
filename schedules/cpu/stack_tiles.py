"""Register tiles on the stack, not in TVM's workspace pool.

A schedule keeps a kernel's accumulators in a ``local`` buffer (the blocked convolution's
register tile: 2 channel blocks x 14 columns of AVX-512 vectors is 1792 bytes) that it
allocates inside the parallel task.  TVM's ``LowerTVMBuiltin`` puts only ``global``
buffers under 1 KB on the stack; every other allocation becomes a call of
``TVMBackendAllocWorkspace`` and ``TVMBackendFreeWorkspace`` per task, and LLVM, which
cannot see through that call, keeps the tile in memory: a ``memset`` at every init and
stores and reloads around the epilogue.  In MobileNetV2 ``perf`` showed the cost (the
pool's ``Alloc``/``Free`` and libc's ``memset``).

``StackLocalTiles`` marks each constant-size ``local`` allocation of at most
``MAX_TILE_BYTES`` with the ``disable_lower_builtin`` annotation, so ``LowerTVMBuiltin``
leaves it to LLVM codegen, which allocates it in the function's entry block (``alloca``,
once per call of the task function, not per loop iteration) and promotes it to registers
where every access has a constant index.

Why it is sound: only where the buffer lives changes, not a load, a store or their order;
a ``local`` buffer is private to the thread that allocates it either way, and its size is
bounded, so the stack of a pool thread (8 MiB) cannot overflow from
it.  It runs on lowered TIR, in ``parallel_guard.tir_pipeline`` after the S-TIR lowering.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.target import Target

from .common import buffer_bytes
from .llvm_pass import llvm_prim_func_pass

# The annotation LowerTVMBuiltin reads (transform::kDisableLowerTVMBuiltin).
DISABLE_LOWER_BUILTIN = "disable_lower_builtin"
# Largest tile moved to the stack: 32 AVX-512 registers are 2 KiB; attention and
# reduction rules keep row tiles of a few KiB.
MAX_TILE_BYTES = 16 << 10


def _on_stack(alloc: tirx.AllocBuffer) -> tirx.Stmt:
    buffer = alloc.buffer
    size = buffer_bytes(buffer)
    if buffer.scope() != "local" or size is None or size > MAX_TILE_BYTES:
        return alloc
    if DISABLE_LOWER_BUILTIN in alloc.annotations:
        return alloc
    return tirx.AllocBuffer(buffer, {**alloc.annotations, DISABLE_LOWER_BUILTIN: tirx.IntImm("bool", 1)},
                            alloc.span)


def stack_local_tiles(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with its small constant-size ``local`` allocations marked for the stack."""
    return tvm_ffi.structural_map(func, [(tirx.AllocBuffer, _on_stack)])


def StackLocalTiles(target: Target | None = None) -> tvm.transform.Pass:
    """PrimFunc pass applying ``stack_local_tiles`` to the PrimFuncs compiled for an LLVM
    target (the PrimFunc's ``target`` attr, else ``target``, else ``with target:``)."""
    return llvm_prim_func_pass(stack_local_tiles, target, "StackLocalTiles")
