"""``(x % m) % c`` written ``x % c`` where ``c`` divides ``m`` (``schedules.cpu.index_forms``).

Checked against the definition at many integer points (negative ones included: floormod),
and left alone where ``c`` does not provably divide ``m``.  The S-TIR passes up to
``ConvertBlocksToOpaque`` run once in the CPU pipeline: argmax and argmin, whose running
value only the reduction block reads, are compared with numpy.
"""

import itertools

import numpy as np
import pytest
import tvm
from tvm import te, tirx, topi
from tvm.s_tir import Schedule

from schedules.cpu.index_forms import after_opaque_blocks, fold_nested_mods, opaque_blocks
from schedules.cpu.parallel_guard import tir_pipeline


def _func(expr: tirx.Expr, *params: tirx.Var) -> tirx.PrimFunc:
    out = tvm.tirx.decl_buffer((1,), "int64", name="out")
    return tirx.PrimFunc([*params, out], tirx.BufferStore(out, expr, [tirx.const(0, "int64")]))


def _value(func: tirx.PrimFunc) -> tirx.Expr:
    return func.body.value


x, b = tirx.Var("x", "int64"), tirx.Var("b", "int64")


@pytest.mark.parametrize("modulus, c, folded", [(b * 8, 8, True), (tirx.const(12, "int64"), 4, True),
                                                (b * 6, 4, False), (b, 4, False)],
                         ids=["b*8 by 8", "12 by 4", "b*6 by 4", "b by 4"])
def test_folds_only_where_the_inner_modulus_is_a_multiple(modulus, c, folded):
    expr = tirx.floormod(tirx.floormod(x, modulus), c)
    got = _value(fold_nested_mods(_func(expr, x, b)))
    if folded:
        tvm.ir.assert_structural_equal(got, tirx.floormod(x, c))
    else:
        tvm.ir.assert_structural_equal(got, expr)


def test_folded_form_agrees_with_the_definition():
    expr = tirx.floormod(tirx.floormod(x, b * 8), 8)
    got = _value(fold_nested_mods(_func(expr, x, b)))
    for xv, bv in itertools.product(range(-40, 41, 3), (1, 2, 3, 5)):
        analyzer = tvm.sym.Analyzer()
        analyzer.bind(x, tirx.const(xv, "int64"))
        analyzer.bind(b, tirx.const(bv, "int64"))
        assert analyzer.simplify(got).value == (xv % (bv * 8)) % 8 == xv % 8


def test_leaves_other_expressions_alone():
    expr = tirx.floordiv(tirx.floormod(x, b * 8), 8)
    tvm.ir.assert_structural_equal(_value(fold_nested_mods(_func(expr, x, b))), expr)


def _column_arg_reduction(op: str) -> tvm.IRModule:
    """``op`` over the rows of an 8 x 32 matrix, computed per tile of 8 columns with the
    reduction loop outside the unrolled columns (the Reduction rule's shape of nest)."""
    data = te.placeholder((8, 32), "float32", name="x")
    sch = Schedule(te.create_prim_func([data, getattr(topi, op)(data, axis=0)]))
    temp, out = sch.get_sblock("x_red_temp"), sch.get_sblock("x_red")
    outer, _ = sch.split(sch.get_loops(out)[0], [None, 8])
    sch.compute_at(temp, outer)
    column, row = sch.get_loops(temp)[-2:]
    sch.reorder(row, column)
    sch.unroll(column)
    return tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")})


@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_cpu_pipeline_keeps_the_running_value_across_the_reduction(op):
    """A second PlanAndUpdateBufferAllocationLocation on opaque blocks moved the running
    value into the reduction loop (a fresh buffer per row): wrong indices."""
    data = np.random.default_rng(3).standard_normal((8, 32)).astype("float32")
    kernel = tvm.compile(_column_arg_reduction(op), target="llvm", tir_pipeline=tir_pipeline())["main"]
    out = tvm.runtime.tensor(np.zeros(32, "int32"))
    kernel(tvm.runtime.tensor(data), out)
    np.testing.assert_array_equal(out.numpy(), getattr(np, op)(data, axis=0))


def test_after_opaque_blocks_skips_the_passes_that_ran():
    once = tvm.transform.Sequential(opaque_blocks())(_column_arg_reduction("argmax"))
    again = after_opaque_blocks(tvm.transform.Sequential(opaque_blocks()))(once)
    tvm.ir.assert_structural_equal(again, once)
