"""NormalizeCreationOps: aranges typed with their true length, non-finite fills that lower.

Relax types ``arange(start, end, step)`` with ``(end - start + step - 1) // step``
elements, wrong for a negative step (``arange(6, -1, -1)``: 9 of 7); TVM's legalization
of ``full`` with an infinite or NaN fill raises ``TypeError``. References are numpy and
PyTorch: TVM's default build returns an ``n + 2``-element descending arange.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, sym, tirx

import aicf_tvm
from aicf_tvm import UnsupportedModelError
from relax_passes.creation_ops import NormalizeCreationOps, arange_form

TARGET = {"kind": "llvm", "num-cores": 2}


def _module(make, *shapes: tuple) -> tvm.IRModule:
    """``main(*params) = make(*params)``, one float32 parameter per shape."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"p{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(make(*params))
        bb.emit_func_output(out)
    return bb.get()


def _extent(param: relax.Var, axis: int = 0) -> tirx.Expr:
    return param.ty.shape.values[axis]


_DESCENDING = {  # (start, stop, step) as functions of the length n
    "n-1..-1": (lambda n: n - 1, lambda n: -1, -1),
    "n..0 by -2": (lambda n: n, lambda n: 0, -2),
    "n-3..0 (empty below 3)": (lambda n: n - 3, lambda n: 0, -1),
    "n+2..n-3 by -3": (lambda n: n + 2, lambda n: n - 3, -3),
}


@pytest.mark.parametrize("dtype", ["float32", "int64"])
@pytest.mark.parametrize("case", list(_DESCENDING))
def test_descending_arange_over_a_symbolic_length_matches_numpy(case, dtype):
    """The result feeds a sum with its own square, so its length and values are checked."""
    start, stop, step = _DESCENDING[case]

    def make(x):
        seq = relax.op.arange(start(_extent(x)), stop(_extent(x)), step, dtype=dtype)
        return relax.op.add(seq, relax.op.multiply(seq, seq))

    compiled = aicf_tvm.compile(_module(make, (tirx.Var("n", "int64"),)), target=TARGET)
    for n in (0, 1, 6, 11):
        seq = np.arange(start(n), stop(n), step, dtype=dtype)
        got = np.asarray(compiled(np.zeros(n, "float32")))
        np.testing.assert_array_equal(got, seq + seq * seq, err_msg=f"n={n}")


def test_constant_descending_arange_is_typed_with_its_length():
    """Typed with 9 elements before (TVM's default build returns 9 values of 7)."""
    def make(x):
        seq = relax.op.arange(6, -1, -1, dtype="float32")
        return relax.op.add(seq, relax.op.multiply(seq, x))

    mod = _module(make, (1,))
    after = NormalizeCreationOps()(mod)
    assert [int(d) for d in after["main"].ret_ty.shape.values] == [7]
    tvm.ir.assert_structural_equal(NormalizeCreationOps()(after), after)
    x = np.array([1.5], "float32")
    seq = np.arange(6, -1, -1, dtype="float32")
    got = np.asarray(aicf_tvm.compile(mod, target=TARGET)(x))
    np.testing.assert_array_equal(got, seq + seq * x)


def test_ascending_arange_is_left_alone():
    n = tirx.Var("n", "int64")
    assert arange_form(relax.op.arange(1, n, 2, dtype="int64"), sym.Analyzer()) is None


def test_arange_of_a_step_of_unknown_sign_is_refused():
    """``m`` may be 0 (a dim) and ``-m`` of unknown sign: no length can be given."""
    mod = _module(lambda x, y: relax.op.arange(0, _extent(x), _extent(y), dtype="int64"),
                  (tirx.Var("n", "int64"),), (tirx.Var("m", "int64"),))
    with pytest.raises(UnsupportedModelError, match=r"arange\(0, n, m\)"):
        NormalizeCreationOps()(mod)


@pytest.mark.parametrize("fill, dtype",
                         [(-np.inf, "float32"), (np.inf, "float16"), (np.nan, "float32")])
def test_non_finite_full_over_a_symbolic_square_lowers(fill, dtype):
    """The causal mask ``triu(full((n, n), -inf), 1)`` and its kin: TVM's legalization of
    ``full`` raised ``TypeError``."""
    def make(x):
        n = _extent(x)
        mask = relax.op.full(relax.ShapeExpr([n, n]), relax.const(fill, "float32"), dtype)
        like = relax.op.full_like(x, relax.const(fill, "float32"))
        tri = relax.op.astype(relax.op.triu(mask, 1), "float32")
        return relax.op.add(relax.op.expand_dims(relax.op.add(x, like), -1), tri)

    compiled = aicf_tvm.compile(_module(make, (tirx.Var("n", "int64"),)), target=TARGET)
    for n in (1, 6):
        x = np.random.default_rng(n).standard_normal(n).astype("float32")
        tri = np.triu(np.full((n, n), fill, dtype), 1).astype("float32")
        want = (x + np.float32(fill))[:, None] + tri
        np.testing.assert_array_equal(np.asarray(compiled(x)), want)


def test_non_finite_fill_of_an_integer_tensor_is_refused():
    inf = relax.const(np.inf, "float32")
    mod = _module(lambda x: relax.op.full(relax.ShapeExpr([2]), inf, "int32"), (2,))
    with pytest.raises(UnsupportedModelError, match="relax.full.*float dtype"):
        NormalizeCreationOps()(mod)
