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


def test_static_reshapes_index_plainly():
    """[24, 48] -> [1, 24, 48] (GPT-2's GEMM result back to 3-D) reads x[i, j], and
    [1, 6, 4, 48] -> [24, 48] x[0, o // 4, o % 4, j]: no division by a whole row's length."""
    mod = relax.transform.LegalizeOps({"relax.reshape": legalize_reshape})(
        _reshape_module([_i(24), _i(48)], [_i(24), _i(48)], [_i(1), _i(24), _i(48)]))
    text = "\n".join(f.script() for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc))
    assert "//" not in text and "%" not in text
    mod = relax.transform.LegalizeOps({"relax.reshape": legalize_reshape})(
        _reshape_module([_i(1), _i(6), _i(4), _i(48)], [_i(1), _i(6), _i(4), _i(48)], [_i(24), _i(48)]))
    text = "\n".join(f.script() for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc))
    assert "// T.int64(4)" in text and "% T.int64(4)" in text and "192" not in text


def test_a_gemm_epilogue_behind_a_static_reshape_runs_in_the_gemm_tiles():
    """GPT-2's MLP input as PyTorch writes it: ``addmm`` on a 2-D view, the result viewed
    back to 3-D, then the tanh GELU by elementwise ops. One parallel loop (the epilogue
    inside the GEMM's tiles, not a pass of its own over the result; TOPI's static reshape,
    ``CompileOptions.static_reshapes_by_group=False``, leaves two), and PyTorch's values,
    a row holding +inf, -inf and NaN included."""
    import math

    import torch

    import aicf_tvm

    class MLP(torch.nn.Module):
        def __init__(self, k: int, n: int) -> None:
            super().__init__()
            g = torch.Generator().manual_seed(12)
            self.w = torch.nn.Parameter(torch.randn(k, n, generator=g) * 0.2)
            self.b = torch.nn.Parameter(torch.randn(n, generator=g))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.addmm(self.b, x.view(-1, x.size(-1)), self.w).view(1, x.shape[1], self.w.shape[1])
            return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))

    m, k, n = 40, 64, 96
    model = MLP(k, n).eval()
    x = torch.randn(1, m, k, generator=torch.Generator().manual_seed(13))
    mod = aicf_tvm.from_torch(model, (x,))
    compiled = aicf_tvm.compile(mod, target=llvm_target())
    flat = aicf_tvm.compile(mod, target=llvm_target(), options=aicf_tvm.CompileOptions(static_reshapes_by_group=False))
    for build, loops in ((compiled, 1), (flat, 2)):
        (gemm,) = [f for f in build.lowered.functions.values()
                   if isinstance(f, tirx.PrimFunc) and "gemm" in str(f.attrs.get("aicf.kind", ""))]
        assert gemm.script().count("T.parallel") == loops
    x[0, 3, :3] = torch.tensor([np.inf, -np.inf, np.nan])
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(np.asarray(compiled(x.numpy())), want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(flat(x.numpy())), want, rtol=2e-5, atol=2e-5)
