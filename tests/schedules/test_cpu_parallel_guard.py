"""Parallel loops of symbolic work guarded by their work per call
(``schedules.cpu.parallel_guard``).

The structural cases run the rewrite on hand-written lowered TIR, where the answer follows
from the definition: a parallel loop of symbolic work becomes ``if work >= 4096`` over the
parallel loop and a serial copy; constant work, work that reads a variable bound inside the
loop, and loops already serial stay.  The numeric cases build an S-TIR kernel with a
per-row intermediate through the guarded pipeline and compare with numpy on both sides
of the threshold, a single row included.
"""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import tirx
from tvm.script import tirx as T
from tvm.target import Target

from schedules.cpu.common import MIN_PARALLEL_WORK
from schedules.cpu.parallel_guard import guard_small_parallel, symbolic_work, tir_pipeline


@T.prim_func
def symbolic_rows(a: T.handle, b: T.handle):
    n = T.int64()
    A = T.match_buffer(a, (n * T.int64(64),), "float32")
    B = T.match_buffer(b, (n * T.int64(64),), "float32")
    for i in T.parallel(n):
        for j in range(T.int64(64)):
            B[i * T.int64(64) + j] = A[i * T.int64(64) + j] * T.float32(2)


@T.prim_func
def constant_rows(A: T.Buffer((256,), "float32"), B: T.Buffer((256,), "float32")):
    for i in T.parallel(4):
        for j in range(64):
            B[i * 64 + j] = A[i * 64 + j]


@T.prim_func
def triangular(a: T.handle, b: T.handle):
    n = T.int64()
    A = T.match_buffer(a, (n * n,), "float32")
    B = T.match_buffer(b, (n * n,), "float32")
    for i in T.parallel(n):
        for j in range(i + T.int64(1)):
            B[i * n + j] = A[i * n + j]


def _loops(stmt: tirx.Stmt) -> list[tirx.For]:
    found: list[tirx.For] = []
    tvm_ffi.structural_walk(stmt, [(tirx.For, found.append)])
    return found


def _ifs(stmt: tirx.Stmt) -> list[tirx.IfThenElse]:
    found: list[tirx.IfThenElse] = []
    tvm_ffi.structural_walk(stmt, [(tirx.IfThenElse, found.append)])
    return found


def test_guards_parallel_loop_of_symbolic_work():
    """``n * 64`` stores: parallel from 4096 on, a serial copy with its own loop vars below."""
    after = guard_small_parallel(symbolic_rows)
    (guard,) = _ifs(after.body)
    assert isinstance(guard.then_case, tirx.For) and guard.then_case.kind == tirx.ForKind.PARALLEL
    assert isinstance(guard.else_case, tirx.For) and guard.else_case.kind == tirx.ForKind.SERIAL
    assert not guard.then_case.loop_var.same_as(guard.else_case.loop_var)
    n = guard.then_case.extent
    for rows in (1, 63, 64, 65):
        analyzer = tvm.sym.Analyzer()
        analyzer.bind(n, tirx.const(rows, "int64"))
        value = analyzer.simplify(guard.condition)
        assert bool(value.value) == (rows * 64 >= MIN_PARALLEL_WORK), rows


@T.prim_func
def row_buffer(a: T.handle, b: T.handle):
    n = T.int64()
    A = T.match_buffer(a, (n * n,), "float32")
    B = T.match_buffer(b, (n * n,), "float32")
    for i in T.parallel(n):
        C = T.alloc_buffer((n,))
        for j in range(n):
            C[j] = A[i * n + j] * T.float32(2)
        for j in range(n):
            B[i * n + j] = C[n - j - T.int64(1)]


def test_serial_copy_allocates_a_row_buffer_once():
    """A buffer of symbolic size is a heap workspace: per iteration in the parallel loop
    (each thread its own), once before the serial one."""
    (guard,) = _ifs(guard_small_parallel(row_buffer).body)
    assert isinstance(guard.then_case.body.seq[0], tirx.AllocBuffer)
    serial = guard.else_case
    assert isinstance(serial, tirx.SeqStmt) and isinstance(serial.seq[0], tirx.AllocBuffer)
    assert isinstance(serial.seq[1], tirx.For) and serial.seq[1].kind == tirx.ForKind.SERIAL
    assert not any(isinstance(s, tirx.AllocBuffer) for s in serial.seq[1].body.seq)


def test_leaves_constant_work_alone():
    """The schedule decided a constant extent already."""
    tvm.ir.assert_structural_equal(guard_small_parallel(constant_rows), constant_rows)


def test_leaves_work_that_reads_an_inner_variable_alone():
    """A triangular nest's work reads ``i``, unknown before the loop."""
    tvm.ir.assert_structural_equal(guard_small_parallel(triangular), triangular)


def test_is_idempotent():
    once = guard_small_parallel(symbolic_rows)
    assert len(_ifs(guard_small_parallel(once).body)) == 1
    assert [loop.kind for loop in _loops(once.body)].count(tirx.ForKind.PARALLEL) == 1


def test_symbolic_work_counts_vector_lanes():
    @T.prim_func
    def vector(A: T.Buffer((64,), "float32")):
        for i in range(4):
            A[T.Ramp(i * 16, 1, 16)] = T.Broadcast(T.float32(0), 16)

    assert tvm.sym.Analyzer().simplify(symbolic_work(vector.body)).value == 64


@T.prim_func(s_tir=True)
def row_scale(a: T.handle, b: T.handle):
    """b = a / max(a) per row, the max in a per-row intermediate under the parallel loop."""
    n = T.int64()
    A = T.match_buffer(a, (n, T.int64(48)), "float32")
    B = T.match_buffer(b, (n, T.int64(48)), "float32")
    M = T.sblock_alloc_buffer((n,))
    for i in T.parallel(n):
        for k in range(T.int64(48)):
            with T.sblock("max"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    M[vi] = T.float32(-3.4e38)
                M[vi] = T.max(M[vi], A[vi, vk])
        for j in range(T.int64(48)):
            with T.sblock("scale"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = A[vi, vj] / M[vi]


@pytest.mark.parametrize("rows", [1, 5, 85, 86, 300])
def test_guarded_build_matches_numpy(rows):
    """Both sides of the threshold (85 rows x 48 stores < 4096 <= 86 x 48)."""
    target = Target({"kind": "llvm"})
    lib = tvm.tirx.build(tvm.IRModule({"main": row_scale}), target, pipeline=tir_pipeline())
    rng = np.random.default_rng(rows)
    a = rng.uniform(0.5, 2.0, (rows, 48)).astype("float32")
    b = tvm.runtime.tensor(rng.standard_normal((rows, 48)).astype("float32"))
    lib(tvm.runtime.tensor(a), b)
    np.testing.assert_allclose(b.numpy(), a / a.max(axis=1, keepdims=True), rtol=1e-6)


@T.prim_func(s_tir=True)
def reversed_rows(a: T.handle, b: T.handle):
    """b[i, j] = 2 * a[i, n - 1 - j] through a per-row intermediate of symbolic size."""
    n = T.int64()
    A = T.match_buffer(a, (n, n), "float32")
    B = T.match_buffer(b, (n, n), "float32")
    C = T.sblock_alloc_buffer((n, n))
    for i in T.parallel(n):
        for j in range(n):
            with T.sblock("double"):
                vi, vj = T.axis.remap("SS", [i, j])
                C[vi, vj] = A[vi, vj] * T.float32(2)
        for j in range(n):
            with T.sblock("reverse"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = C[vi, n - vj - T.int64(1)]


@pytest.mark.parametrize("rows", [1, 3, 17, 45, 46, 100])
def test_guarded_row_buffer_matches_numpy(rows):
    """The row buffer hoisted out of the serial loop (below 46 rows) and per iteration in
    the parallel one (46 x 46 x 2 stores >= 4096)."""
    target = Target({"kind": "llvm"})
    lib = tvm.tirx.build(tvm.IRModule({"main": reversed_rows}), target, pipeline=tir_pipeline())
    rng = np.random.default_rng(100 + rows)
    a = rng.standard_normal((rows, rows)).astype("float32")
    b = tvm.runtime.tensor(rng.standard_normal((rows, rows)).astype("float32"))
    lib(tvm.runtime.tensor(a), b)
    np.testing.assert_array_equal(b.numpy(), 2 * a[:, ::-1])
