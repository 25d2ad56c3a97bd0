"""The default CPU rules on PrimFuncs with symbolic extents (``seq``, ``batch * seq`` rows).

One PrimFunc is scheduled and built once, then run at several bindings of its symbolic
dims, odd ones included (1, 7, 33, 100), and compared with numpy: the tails are handled
inside the kernel.  Each case also checks which rule took the kernel, since a symbolic
kernel that silently falls through to a generic rule is correct but many times slower.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.relax.dpl import is_op, wildcard

from schedules import default_rules, schedule_func

from .test_cpu_gemm import _gelu, fused_primfunc

F32 = "float32"
SIZES = (1, 7, 33, 100)


@pytest.fixture(scope="module")
def target() -> tvm.target.Target:
    config = dict(tvm.target.Target.from_device(tvm.cpu()).export())
    config["num-cores"] = 2
    return tvm.target.Target(config)


class Kernel:
    """A PrimFunc scheduled by the default rules and built once; called with named inputs."""

    def __init__(self, func: tirx.PrimFunc, target: tvm.target.Target) -> None:
        scheduled = schedule_func(func, target, default_rules(target))
        assert scheduled is not None
        self.rule = str(scheduled.attrs["aicf.schedule"])
        self.names = [str(p) for p in func.params][:-1]
        module = tvm.IRModule({"main": scheduled.with_attr("global_symbol", "main")})
        self.kernel = tvm.compile(module, target=target)["main"]

    def check(self, inputs: dict[str, np.ndarray], expected: np.ndarray) -> None:
        """Run on ``inputs`` (matched to the params by name) and compare with ``expected``."""
        out = tvm.runtime.tensor(np.zeros(expected.shape, np.float32))
        self.kernel(*[tvm.runtime.tensor(inputs[n]) for n in self.names], out)
        atol = 1e-4 * math.sqrt(max(expected.size, 1))
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=atol)


def linear_bias_gelu(rows, k: int, n: int) -> tirx.PrimFunc:
    """``gelu(x @ w.T + b)`` with ``rows`` rows: a Linear layer of a transformer."""
    shapes = {"x": (rows, k), "w": (n, k), "b": (n,)}

    def build(bb, x, w, b):
        y = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(w))))
        return relax.op.nn.gelu(bb.emit(relax.op.add(y, b)))

    pattern = is_op("relax.nn.gelu")(
        is_op("relax.add")(
            is_op("relax.matmul")(wildcard(), is_op("relax.permute_dims")(wildcard())), wildcard()
        )
    )
    return fused_primfunc(build, shapes, pattern)


def test_gemm_with_symbolic_rows_gets_the_gemm_rule(target):
    """M = seq is padded to whole register strips at run time; N = 40 and K = 70 stay static."""
    seq = tirx.Var("seq", "int64")
    kernel = Kernel(linear_bias_gelu(seq, 70, 40), target)
    assert kernel.rule == "Gemm"
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((40, 70), dtype=np.float32), rng.standard_normal(40, dtype=np.float32)
    for rows in SIZES:
        x = rng.standard_normal((rows, 70), dtype=np.float32)
        kernel.check({"x": x, "w": w, "b": b}, _gelu(x @ w.T + b))


@pytest.mark.parametrize("w_batched", [False, True], ids=["2d-weight", "batched-weight"])
def test_batched_gemm_with_symbolic_batch_and_rows(target, w_batched):
    """A symbolic batch (S) and rows (I): ``x[batch, seq, 24] @ w[(batch,) 24, 48]``."""
    batch, seq = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    w_shape = (batch, 24, 48) if w_batched else (24, 48)
    func = fused_primfunc(lambda bb, x, w: relax.op.matmul(x, w), {"x": (batch, seq, 24), "w": w_shape})
    kernel = Kernel(func, target)
    assert kernel.rule == "Gemm"
    rng = np.random.default_rng(1)
    for b, rows in [(1, 1), (2, 7), (3, 33), (1, 100)]:
        x = rng.standard_normal((b, rows, 24), dtype=np.float32)
        w = rng.standard_normal((b, 24, 48) if w_batched else (24, 48), dtype=np.float32)
        kernel.check({"x": x, "w": w}, x @ w)


def test_attention_scores_with_symbolic_query_and_key_length(target):
    """``q[h, seq, 64] @ k[h, 64, seq]``: both M and N symbolic (N padded to whole vectors)."""
    seq = tirx.Var("seq", "int64")
    func = fused_primfunc(lambda bb, q, k: relax.op.matmul(q, k), {"q": (4, seq, 64), "k": (4, 64, seq)})
    kernel = Kernel(func, target)
    assert kernel.rule == "Gemm"
    rng = np.random.default_rng(2)
    for rows in SIZES:
        q = rng.standard_normal((4, rows, 64), dtype=np.float32)
        k = rng.standard_normal((4, 64, rows), dtype=np.float32)
        kernel.check({"q": q, "k": k}, q @ k)


def test_attention_values_with_symbolic_reduction_length(target):
    """``p[h, seq, seq] @ v[h, seq, 64]``: K symbolic (not blocked, not padded)."""
    seq = tirx.Var("seq", "int64")
    func = fused_primfunc(lambda bb, p, v: relax.op.matmul(p, v), {"p": (4, seq, seq), "v": (4, seq, 64)})
    kernel = Kernel(func, target)
    assert kernel.rule == "Gemm"
    rng = np.random.default_rng(3)
    for rows in SIZES:
        p = rng.standard_normal((4, rows, rows), dtype=np.float32)
        v = rng.standard_normal((4, rows, 64), dtype=np.float32)
        kernel.check({"p": p, "v": v}, p @ v)
