"""Register tiles on the stack (``schedules.cpu.stack_tiles``).

The structural cases run the rewrite on hand-written lowered TIR: a constant-size
``local`` tile inside a parallel task is marked for the stack; a ``global`` buffer, a tile
over the size bound and a symbolic-size one are left to TVM's workspace pool.  The build
case compiles a chain of blocked 1x1 convolutions: its register tiles (2 channel blocks x
14 columns, 1792 bytes) must not be allocated through ``TVMBackendAllocWorkspace``, and
the output must match PyTorch's on an input it depends on.
"""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import tirx
from tvm.script import tirx as T

import aicf_tvm
from schedules.cpu import stack_tiles
from schedules.cpu.stack_tiles import DISABLE_LOWER_BUILTIN, MAX_TILE_BYTES, stack_local_tiles

torch = pytest.importorskip("torch")


@T.prim_func
def tiles(A: T.Buffer((64, 256), "float32"), B: T.Buffer((64, 16), "float32")):
    for i in T.parallel(64):
        acc = T.alloc_local((16,), "float32")  # 64 bytes: to the stack
        big = T.alloc_local((MAX_TILE_BYTES // 4 + 1,), "float32")  # over the bound
        row = T.alloc_buffer((256,), "float32")  # global scope: TVM's own rule
        for j in range(256):
            row[j] = A[i, j]
            big[j] = A[i, j]
        for k in range(16):
            acc[k] = T.float32(0)
            for j in range(16):
                acc[k] = acc[k] + row[k * 16 + j] + big[k * 16 + j]
            B[i, k] = acc[k]


@T.prim_func
def symbolic_tile(a: T.handle, b: T.handle):
    n = T.int64()
    A = T.match_buffer(a, (n,), "float32")
    B = T.match_buffer(b, (n,), "float32")
    for i in T.parallel(T.int64(4)):
        acc = T.alloc_local((n,), "float32")
        for j in range(n):
            acc[j] = A[j]
            B[j] = acc[j]


def _allocs(func: tirx.PrimFunc) -> dict[str, tirx.AllocBuffer]:
    found: list[tirx.AllocBuffer] = []
    tvm_ffi.structural_walk(func.body, [(tirx.AllocBuffer, found.append)])
    return {a.buffer.name: a for a in found}


def test_marks_small_local_tiles_only():
    allocs = _allocs(stack_local_tiles(tiles))
    assert bool(allocs["acc"].annotations[DISABLE_LOWER_BUILTIN])
    assert DISABLE_LOWER_BUILTIN not in allocs["big"].annotations
    assert DISABLE_LOWER_BUILTIN not in allocs["row"].annotations


def test_leaves_symbolic_tiles_alone():
    assert DISABLE_LOWER_BUILTIN not in _allocs(stack_local_tiles(symbolic_tile))["acc"].annotations


def test_is_idempotent():
    once = stack_local_tiles(tiles)
    tvm.ir.assert_structural_equal(stack_local_tiles(once), once)


def _chain():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(64, 384, 1), torch.nn.ReLU6(),
                               torch.nn.Conv2d(384, 64, 1)).eval()


def _workspace_calls(compiled) -> int:
    ll = "".join(m.inspect_source("ll") for m in compiled.executable.mod.imports if m.kind == "llvm")
    return ll.count("load ptr, ptr @__TVMBackendAllocWorkspace")


def test_blocked_conv_tiles_skip_the_workspace_pool(monkeypatch):
    model = _chain()
    x = torch.randn(1, 64, 14, 14)
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(model, (x,)), target="llvm")
    assert {k.schedule for k in compiled.kernels} >= {"BlockedConv2d"}
    assert _workspace_calls(compiled) == 0
    with torch.no_grad():
        want = [model(v).numpy() for v in (x, torch.randn(1, 64, 14, 14))]
    got = np.asarray(compiled(x.numpy()))
    assert not np.allclose(want[0], want[1])  # the output depends on the input
    np.testing.assert_allclose(got, want[0], rtol=1e-4, atol=1e-4 * np.abs(want[0]).max())

    monkeypatch.setattr(stack_tiles, "MAX_TILE_BYTES", 0)  # the rewrite off: the pool again
    plain = aicf_tvm.compile(aicf_tvm.from_torch(model, (x,)), target="llvm")
    assert _workspace_calls(plain) > 0
    np.testing.assert_array_equal(np.asarray(plain(x.numpy())), got)  # the same bits
