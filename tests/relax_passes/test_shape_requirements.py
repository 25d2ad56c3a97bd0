"""Shape requirements (``relax_passes/shape_requirements.py``, rules in ``shape_rules.py``):
per op, the relation of input dims its inferred type assumes, unless proven under the
bounds. Each expected requirement is the op's own precondition as PyTorch and ONNX Runtime
state it (a matmul's contraction dims equal, a reshape keeps the element count, ...)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from aicf_tvm import UnsupportedModelError
from aicf_tvm.runtime.call_checks import Requirement, evaluate
from relax_passes.shape_requirements import requirements_of, to_json

A, B, C, K = (tirx.Var(n, "int64") for n in "abck")


def _tensor(shape: list, name: str = "x", dtype: str = "float32") -> relax.Var:
    return relax.Var(name, relax.TensorType(shape, dtype))


def _const(*shape: int) -> relax.Expr:
    return relax.const(np.zeros(shape, "float32"))


def _func(params: list, body, bounds: dict | None = None) -> relax.Function:
    bb = relax.BlockBuilder()
    attrs = None
    if bounds:
        attrs = {"tir_var_lower_bound": {k: lo for k, (lo, _) in bounds.items()},
                 "tir_var_upper_bound": {k: hi for k, (_, hi) in bounds.items()}}
    with bb.function("main", params, attrs=attrs):
        with bb.dataflow():
            out = bb.emit_output(body(*params))
        bb.emit_func_output(out)
    return bb.get()["main"]


def _texts(func: relax.Function) -> list[str]:
    return [str(r) for r in requirements_of(func)]


CASES = {
    "matmul by a weight": ([_tensor([A, B])], lambda x: relax.op.matmul(x, _const(16, 8)),
                           ["b == 16"]),
    "matmul of two inputs": ([_tensor([A, K]), _tensor([B, C], "z")], relax.op.matmul, ["k == b"]),
    "batched matmul": ([_tensor([A, 4, 16]), _tensor([C, 16, 8], "z")], relax.op.matmul,
                       ["a == c or a == 1 or c == 1"]),
    "reshape": ([_tensor([A, B])], lambda x: relax.op.reshape(x, [16, 8]), ["a * b == 128"]),
    "broadcast_to": ([_tensor([A, B])], lambda x: relax.op.broadcast_to(x, [A, 16]),
                     ["b == 1 or b == 16"]),
    "slice assumed in bounds": ([_tensor([A])], lambda x: relax.op.strided_slice(
        _const(16, 4), [0], [0], [A], assume_inbound=True), ["a <= 16"]),
    "clamped slice": ([_tensor([A])],
                      lambda x: relax.op.strided_slice(_const(16, 4), [0], [0], [A]), []),
    "conv channels": ([_tensor([1, B, 8, 8])], lambda x: relax.op.nn.conv2d(x, _const(4, 3, 3, 3)),
                      ["b == 3"]),
    "conv too small": ([_tensor([1, 3, A, 8])], lambda x: relax.op.nn.conv2d(x, _const(4, 3, 3, 3)),
                       ["2 <= a"]),
    "squeeze": ([_tensor([A, B])], lambda x: relax.op.squeeze(x, [1]), ["b == 1"]),
    "einsum": ([_tensor([A, B])], lambda x: relax.op.einsum([x, _const(16, 8)], "ij,jk->ik"),
               ["b == 16"]),
    "attention": ([_tensor([1, A, 2, B]), _tensor([1, C, 2, 16], "k"), _tensor([1, C, 2, 8], "v")],
                  relax.op.nn.attention, ["b == 16"]),
    "group_norm": ([_tensor([1, B, 4])], lambda x: relax.op.nn.group_norm(
        x, _const(16), _const(16), 4, 1, [2]), ["b == 16"]),
    "prelu of one slope": ([_tensor([1, B, 4])], lambda x: relax.op.nn.prelu(x, _const(1), 1), []),
    "prelu per channel": ([_tensor([1, B, 4])], lambda x: relax.op.nn.prelu(x, _const(16), 1),
                          ["b == 16"]),
    "scatter_elements": ([_tensor([16, 8]), _tensor([A, B], "i", "int64"), _tensor([A, C], "u")],
                         lambda x, i, u: relax.op.scatter_elements(x, i, u, 0), ["b == c"]),
    "negative padding": ([_tensor([A, B])], lambda x: relax.op.nn.pad(x, [0, 0, -3, 0]),
                         ["3 <= b"]),
    "proven: a layer norm over 16": ([_tensor([A, 16])], lambda x: relax.op.nn.layer_norm(
        x, _const(16), _const(16), [-1]), []),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_op_requires_its_precondition(name):
    params, body, want = CASES[name]
    assert _texts(_func(params, body)) == want


def test_bounds_prove_or_keep_a_slice_requirement():
    """A 16-row table sliced to ``a`` rows: proven for a <= 10, checked for a <= 40 (a slice
    past the end read other memory at a = 40), impossible for a >= 20."""
    def body(x):
        return relax.op.strided_slice(_const(16, 4), [0], [0], [A], assume_inbound=True)

    assert _texts(_func([_tensor([A])], body, {"a": (1, 10)})) == []
    assert _texts(_func([_tensor([A])], body, {"a": (1, 40)})) == ["a <= 16"]
    with pytest.raises(UnsupportedModelError, match=r"strided_slice of a constant float32 "
                                                    r"\[16, 4\] tensor requires .*a.* which no "
                                                    r"input meets"):
        requirements_of(_func([_tensor([A])], body, {"a": (20, 40)}))


def test_requirements_name_the_op_and_its_operands_once_each():
    """The same relation required twice (two matmuls by the weight) is checked once."""
    func = _func([_tensor([A, B])], lambda x: relax.op.add(
        relax.op.matmul(x, _const(16, 8)), relax.op.matmul(x, _const(16, 8))))
    [req] = requirements_of(func)
    assert req.op == "matmul of input x and a constant float32 [16, 8] tensor"
    assert req.role == "its contraction dims"


def test_a_dim_no_input_binds_is_not_required_before_the_call():
    """``nonzero``'s length is data: a reshape of it cannot be checked before the call."""
    def body(x):
        idx = relax.op.nonzero(x)
        return relax.op.reshape(idx, [16])

    assert _texts(_func([_tensor([A], dtype="bool")], body)) == []


def _i(value: int) -> tirx.IntImm:
    return tirx.IntImm("int64", value)


@pytest.mark.parametrize("expr", [
    tirx.EQ(tirx.FloorDiv(A * B, _i(8)) * _i(8), A * B), tirx.LE(tirx.Min(A, _i(16)), B),
    tirx.LT(tirx.Max(A - _i(3), _i(0)), tirx.FloorMod(B, _i(5))),
    tirx.NE(tirx.Select(tirx.GT(A, B), A, B), _i(7)),
    tirx.Or(tirx.EQ(A, _i(1)), tirx.Not(tirx.GE(B, C))),
])
def test_dim_expressions_evaluate_as_tir_does(expr):
    """``to_json`` then ``evaluate`` (and a requirement's compiled check) give what TIR's
    analyzer computes for the same dims: floor division, min/max, select, and/or/not."""
    rng = np.random.default_rng(0)
    json_expr = to_json(expr)
    for _ in range(20):
        dims = {name: int(rng.integers(low, 40)) for name, low in (("a", 0), ("b", 1), ("c", 0))}
        analyzer = tvm.sym.Analyzer()
        for var in (A, B, C):
            analyzer.bind(var, _i(dims[var.name]))
        want = bool(analyzer.simplify(expr))
        assert bool(evaluate(json_expr, dims)) == want, (json_expr, dims)
        bound = {name: (value, "x", 0) for name, value in dims.items()}
        assert bool(Requirement(json_expr, "op", "role").holds(bound)) == want, (json_expr, dims)
