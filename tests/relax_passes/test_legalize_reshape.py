"""legalize_reshape: symbolic reshapes index group by group and compute what numpy does."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from relax_passes.legalize_reshape import group_axes, legalize_reshape

from ..conftest import llvm_target

B, S = tirx.Var("b", "int64"), tirx.Var("s", "int64")


def _i(v: int) -> tirx.IntImm:
    return tirx.IntImm("int64", v)


@pytest.mark.parametrize("src, dst, groups", [
    ([B, S, _i(64)], [B * S, _i(64)], [([0, 1], [0]), ([2], [1])]),
    ([B, _i(1), _i(2), S, _i(64)], [B * _i(2), S, _i(64)], [([0, 1, 2], [0]), ([3], [1]), ([4], [2])]),
    ([B * _i(2), S], [B, _i(2) * S], [([0, 1], [0, 1])]),
    ([B, S], [B, S, _i(1)], [([0], [0]), ([1], [1, 2])]),
    ([B, S], [S, B], None),  # no consecutive groups: TOPI's kernel
])
def test_axes_group_by_equal_products(src, dst, groups):
    assert group_axes(src, dst) == groups


def _value(extent: tirx.PrimExpr, b: int, s: int) -> int:
    analyzer = tvm.sym.Analyzer()
    analyzer.bind(B, _i(b))
    analyzer.bind(S, _i(s))
    return int(analyzer.simplify(extent))


def _reshape_module(base: list, src: list, dst: list) -> tvm.IRModule:
    """main(x: base) = reshape(relu(reshape(x, src)), dst): relu makes ``src`` a real buffer."""
    x = relax.Var("x", relax.TensorType(base, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.reshape(x, src) if src != base else x))
            out = bb.emit_output(relax.op.reshape(y, dst))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("base, src, dst, cases", [
    ([B, S, _i(64)], [B, S, _i(64)], [B * S, _i(2), _i(32)], [(1, 1), (3, 5)]),
    ([B, _i(2), S, _i(6)], [B, _i(2), S, _i(6)], [B * _i(2), S * _i(2), _i(3)], [(1, 1), (2, 7)]),
    ([B, _i(2), S], [B * _i(2), S], [B, _i(2) * S], [(1, 3), (4, 2)]),
    ([B, S], [B, S], [S, B], [(2, 3)]),
])
def test_grouped_kernels_match_numpy_for_every_binding(base, src, dst, cases):
    """Reshapes of symbolic shapes (the grouped kernel, or TOPI's where no groups exist)
    give the values of numpy's row-major reshape at each binding of (b, s)."""
    mod = relax.transform.LegalizeOps({"relax.reshape": legalize_reshape})(_reshape_module(base, src, dst))
    ex = tvm.compile(mod, target=llvm_target())
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(11)
    for b, s in cases:
        shape, mid, new = ([_value(d, b, s) for d in dims] for dims in (base, src, dst))
        x = rng.standard_normal(shape).astype("float32")
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_array_equal(got, np.maximum(x.reshape(mid), 0).reshape(new))


def test_grouped_kernel_divides_only_within_groups():
    """[b, 1, 2, s, 64] -> [b * 2, s, 64] reads x[o0 // 2, 0, o0 % 2, o1, o2]: no division
    by a product with the symbolic s (TOPI's kernel divides by s * 2 and s, nested)."""
    base = [B, _i(1), _i(2), S, _i(64)]
    mod = relax.transform.LegalizeOps({"relax.reshape": legalize_reshape})(
        _reshape_module(base, base, [B * _i(2), S, _i(64)]))
    text = "\n".join(f.script() for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc))
    assert "// T.int64(2)" in text and "% T.int64(2)" in text
    assert "// s" not in text and "% s" not in text and "// (s" not in text
