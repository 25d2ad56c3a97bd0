"""``(x % m) % c`` written ``x % c`` where ``c`` divides ``m`` (``schedules.cpu.index_forms``).

Checked against the definition at many integer points (negative ones included: floormod),
and left alone where ``c`` does not provably divide ``m``.
"""

import itertools

import pytest
import tvm
from tvm import tirx

from schedules.cpu.index_forms import fold_nested_mods


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
