"""Vector tails split off by their predicates alone (``schedules.cpu.tail_partition``).

The structural case checks the split of a hinted loop of symbolic extent (the whole
vectors without their predicate, the rest with it) and that a loop of constant extent
keeps its hint.
The numeric cases compile ``tril`` / ``triu`` of a symbolic square with several
diagonals: with the hint, ``LoopPartition`` also split on the diagonal's comparison at a
point below 0 for the first rows, and the kernel wrote before its output (heap
corruption). They are compared with numpy at sizes below, at and above the vector width.
"""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, s_tir, te, tirx
from tvm.s_tir import Schedule

import aicf_tvm
from schedules.cpu.common import PARTITION_HINT, split_vector_tail
from schedules.cpu.index_forms import opaque_blocks
from schedules.cpu.tail_partition import partition_vector_tails

TARGET = {"kind": "llvm", "num-cores": 2}


def _loops(func: tirx.PrimFunc) -> list[tirx.For]:
    found: list[tirx.For] = []
    tvm_ffi.structural_walk(func.body, [(tirx.For, found.append)])
    return found


def _lower_triangle(extent) -> tirx.PrimFunc:
    """``B[i, j] = A[i, j] if j + 2 <= i else 0``, the columns split into vectors of 16."""
    a = te.placeholder((extent, extent), "float32", name="A")
    zero = tirx.const(0.0, "float32")
    b = te.compute(a.shape, lambda i, j: tirx.Select(j + 2 <= i, a[i, j], zero), name="B")
    sch = Schedule(te.create_prim_func([a, b]))
    columns = sch.get_loops(sch.get_sblock("B"))[1]
    if isinstance(extent, int):
        outer, inner = sch.split(columns, [None, 16])
        sch.annotate(outer, PARTITION_HINT, tirx.IntImm("int32", 1))
    else:
        outer, inner = split_vector_tail(sch, columns, 16)
    sch.vectorize(inner)
    return tvm.transform.Sequential(opaque_blocks())(sch.mod)["main"]


def test_symbolic_loop_splits_into_whole_vectors_and_a_predicated_tail():
    """``for o in [0, (n + 15) // 16)`` with ``16 o + i < n``: the vectors ``o < n // 16``
    without the predicate, the rest with it; the diagonal's comparison stays a select."""
    func = partition_vector_tails(_lower_triangle(tirx.Var("n", "int64")))
    n = func.params[0].ty.shape[0]
    columns = [loop for loop in _loops(func) if loop.loop_var.name.startswith("j_0")]
    assert len(columns) == 2 and not any(PARTITION_HINT in loop.annotations for loop in columns)
    analyzer = tvm.sym.Analyzer()
    analyzer.update(n, tvm.sym.ConstIntBound(0, tvm.sym.ConstIntBound.POS_INF))
    main, tail = (loop.extent for loop in columns)
    assert analyzer.can_prove_equal(main, tirx.floordiv(n, 16))
    assert analyzer.can_prove_equal(main + tail, tirx.floordiv(n + 15, 16))
    predicates = []
    for loop in columns:
        tvm_ffi.structural_walk(
            loop.body, [(s_tir.SBlockRealize, lambda r: predicates.append(r.predicate))])
    assert [isinstance(p, tirx.IntImm) and p.value == 1 for p in predicates] == [True, False]


def test_constant_loop_keeps_its_hint():
    func = _lower_triangle(40)
    tvm.ir.assert_structural_equal(partition_vector_tails(func), func)


def _masked_sum(op: str, k: int) -> tvm.IRModule:
    n = tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, n), "float32"))
    y = relax.Var("y", relax.TensorType((n, n), "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(y, getattr(relax.op, op)(x, k)))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("op, k", [("tril", -2), ("tril", 3), ("triu", -2), ("triu", 1)])
def test_triangle_of_a_symbolic_square_matches_numpy(op, k):
    compiled = aicf_tvm.compile(_masked_sum(op, k), target=TARGET)
    rng = np.random.default_rng(5)
    for size in (1, 5, 16, 19, 40):
        x, y = (rng.standard_normal((size, size)).astype("float32") for _ in range(2))
        want = y + getattr(np, op)(x, k)
        np.testing.assert_array_equal(np.asarray(compiled(x, y)), want, err_msg=f"n={size}")
