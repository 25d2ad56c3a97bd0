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
from tvm.script import tirx as T

from schedules import default_rules, schedule_func
from schedules.cpu.gemm import Gemm

from ..helpers import relax_main
from .test_cpu_gemm import _gelu, fused_primfunc

F32 = "float32"
SIZES = (1, 7, 33, 100)


@pytest.fixture(scope="module")
def target() -> tvm.target.Target:
    config = dict(tvm.target.Target.from_device(tvm.cpu()).export())
    config["num-cores"] = 2
    return tvm.target.Target(config)


def only_primfunc(build, inputs: dict[str, tuple]) -> tirx.PrimFunc:
    """The one PrimFunc Relax's FuseOps makes of ``build(bb, *vars)``."""
    params = [relax.Var(name, relax.TensorType(shape, F32)) for name, shape in inputs.items()]
    mod = relax_main(params, build)
    for transform in (relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                      relax.transform.FuseOps(), relax.transform.FuseTIR()):
        mod = transform(mod)
    funcs = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    assert len(funcs) == 1, f"expected one PrimFunc, got {len(funcs)}"
    return funcs[0]


class Kernel:
    """A PrimFunc scheduled by the default rules and built once; called with named inputs."""

    def __init__(self, func: tirx.PrimFunc, target: tvm.target.Target) -> None:
        scheduled = schedule_func(func, target, default_rules(target))
        assert scheduled is not None
        self.rule = str(scheduled.attrs["aicf.schedule"])
        self.script = scheduled.script()
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


def test_gemm_with_symbolic_rows_blocks_strips_and_splits_off_the_rest(target):
    """M = seq next to a static N is blocked by whole strips like a static M; the strips of
    the last block past M are split off at lowering (the hint on the strip loop), so any
    number of rows, around a block boundary and over several blocks, gives x @ w.T + b."""
    seq = tirx.Var("seq", "int64")
    kernel = Kernel(linear_bias_gelu(seq, 70, 128), target)
    assert kernel.rule == "Gemm"
    assert "pragma_loop_partition_hint" in kernel.script
    rng = np.random.default_rng(10)
    w, b = rng.standard_normal((128, 70), dtype=np.float32), rng.standard_normal(128, dtype=np.float32)
    for rows in (1, 5, 95, 96, 97, 200, 385):
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


@T.prim_func(s_tir=True)
def _gemm_view_residual(x_h: T.handle, w: T.Buffer((T.int64(24), T.int64(40)), "float32"), r_h: T.handle,
                        out_h: T.handle):
    """``out = r + view(x @ w)``: x is ``[b * s, 24]``, the GEMM's rows viewed as ``[b, s, 40]``
    (the blocks legalization makes of LLaMA's down projection and residual add)."""
    b, s = T.int64(), T.int64()
    x = T.match_buffer(x_h, (b * s, T.int64(24)))
    r = T.match_buffer(r_h, (b, s, T.int64(40)))
    out = T.match_buffer(out_h, (b, s, T.int64(40)))
    y = T.sblock_alloc_buffer((b * s, T.int64(40)))
    view = T.sblock_alloc_buffer((b, s, T.int64(40)))
    for i, j, k in T.grid(b * s, T.int64(40), T.int64(24)):
        with T.sblock("matmul"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                y[vi, vj] = T.float32(0.0)
            y[vi, vj] = y[vi, vj] + x[vi, vk] * w[vk, vj]
    for i0, i1, i2 in T.grid(b, s, T.int64(40)):
        with T.sblock("T_reshape"):
            v0, v1, v2 = T.axis.remap("SSS", [i0, i1, i2])
            view[v0, v1, v2] = y[v0 * s + v1, v2]
    for i0, i1, i2 in T.grid(b, s, T.int64(40)):
        with T.sblock("epilogue"):
            v0, v1, v2 = T.axis.remap("SSS", [i0, i1, i2])
            out[v0, v1, v2] = r[v0, v1, v2] + view[v0, v1, v2]


@T.prim_func(s_tir=True)
def _gemm_view_silu_times(x_h: T.handle, w: T.Buffer((T.int64(24), T.int64(40)), "float32"), r_h: T.handle,
                          out_h: T.handle):
    """``out = silu(view(x @ w)) * r`` (LLaMA's gate projection times the up projection)."""
    b, s = T.int64(), T.int64()
    x = T.match_buffer(x_h, (b * s, T.int64(24)))
    r = T.match_buffer(r_h, (b, s, T.int64(40)))
    out = T.match_buffer(out_h, (b, s, T.int64(40)))
    y = T.sblock_alloc_buffer((b * s, T.int64(40)))
    view = T.sblock_alloc_buffer((b, s, T.int64(40)))
    act = T.sblock_alloc_buffer((b, s, T.int64(40)))
    for i, j, k in T.grid(b * s, T.int64(40), T.int64(24)):
        with T.sblock("matmul"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                y[vi, vj] = T.float32(0.0)
            y[vi, vj] = y[vi, vj] + x[vi, vk] * w[vk, vj]
    for i0, i1, i2 in T.grid(b, s, T.int64(40)):
        with T.sblock("T_reshape"):
            v0, v1, v2 = T.axis.remap("SSS", [i0, i1, i2])
            view[v0, v1, v2] = y[v0 * s + v1, v2]
    for i0, i1, i2 in T.grid(b, s, T.int64(40)):
        with T.sblock("silu"):
            v0, v1, v2 = T.axis.remap("SSS", [i0, i1, i2])
            act[v0, v1, v2] = view[v0, v1, v2] * T.sigmoid(view[v0, v1, v2])
    for i0, i1, i2 in T.grid(b, s, T.int64(40)):
        with T.sblock("epilogue"):
            v0, v1, v2 = T.axis.remap("SSS", [i0, i1, i2])
            out[v0, v1, v2] = act[v0, v1, v2] * r[v0, v1, v2]


@pytest.mark.parametrize("silu", [False, True], ids=["residual", "silu-times-up"])
def test_epilogue_behind_a_row_view_runs_in_the_gemm_tiles(target, silu):
    """The epilogue reads the GEMM's rows at ``b * s + t``: iterated over those rows instead,
    it runs inside the GEMM's parallel row chunks (no second pass over the output). At
    M = 1, 7, 64 (with a row of x holding +inf, -inf, NaN) it gives what numpy gives."""
    func = _gemm_view_silu_times if silu else _gemm_view_residual
    sch = Gemm().apply(func, target, False)
    chunk = sch.get_loops(sch.get_sblock("matmul_update"))[0]
    assert sch.get(sch.get_loops(sch.get_sblock("epilogue"))[0]).same_as(sch.get(chunk))
    kernel = Kernel(func, target)
    assert kernel.rule == "Gemm"
    rng = np.random.default_rng(2)
    for b, t in [(1, 1), (1, 7), (2, 32)]:
        shapes = ((b * t, 24), (24, 40), (b, t, 40))
        x, w, r = (rng.standard_normal(shape, dtype=np.float32) for shape in shapes)
        if b * t > 1:
            x[1, :3] = np.inf, -np.inf, np.nan
        with np.errstate(over="ignore", invalid="ignore"):
            y = (x.astype(np.float64) @ w).reshape(b, t, 40)
            want = y / (1 + np.exp(-y)) * r if silu else r + y
        kernel.check({"x": x, "w": w, "r": r}, want.astype(np.float32))


def test_attention_scores_with_symbolic_query_and_key_length(target):
    """``q[h, seq, 64] @ k[h, 64, seq]``: both M and N symbolic (N padded to whole vectors)."""
    seq = tirx.Var("seq", "int64")
    func = fused_primfunc(lambda bb, q, k: relax.op.matmul(q, k), {"q": (4, seq, 64), "k": (4, 64, seq)})
    kernel = Kernel(func, target)
    assert kernel.rule == "Gemm"
    rng = np.random.default_rng(2)
    assert "T.vectorized" in kernel.script
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


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_softmax_over_symbolic_rows_and_length(target):
    """Attention probabilities ``softmax(s[h, seq, seq])``: rows and reduction symbolic."""
    seq = tirx.Var("seq", "int64")
    func = only_primfunc(lambda bb, s: relax.op.nn.softmax(s, axis=-1), {"s": (4, seq, seq)})
    kernel = Kernel(func, target)
    assert kernel.rule == "Reduction"
    assert "T.vectorized" in kernel.script and "pragma_loop_partition_hint" in kernel.script  # exp, normalize
    rng = np.random.default_rng(4)
    for rows in SIZES:
        s = rng.standard_normal((4, rows, rows), dtype=np.float32)
        kernel.check({"s": s}, _softmax(s))


def test_layer_norm_over_symbolic_rows(target):
    """``layer_norm(x[batch, seq, 48])``: two symbolic row axes, a static normalized axis."""
    batch, seq = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")

    def build(bb, x, g, b):
        return relax.op.nn.layer_norm(x, g, b, axes=[-1], epsilon=1e-5)

    func = only_primfunc(build, {"x": (batch, seq, 48), "g": (48,), "b": (48,)})
    kernel = Kernel(func, target)
    assert kernel.rule == "Reduction"
    rng = np.random.default_rng(5)
    g, b = rng.standard_normal(48, dtype=np.float32), rng.standard_normal(48, dtype=np.float32)
    for n, rows in [(1, 1), (2, 7), (1, 33), (3, 100)]:
        x = rng.standard_normal((n, rows, 48), dtype=np.float32)
        mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        kernel.check({"x": x, "g": g, "b": b}, (x - mean) / np.sqrt(var + 1e-5) * g + b)


def test_elementwise_over_symbolic_rows_is_vectorized(target):
    """``relu(x + y)`` on ``[seq, 40]``: the static row is the vector loop, rows run parallel."""
    seq = tirx.Var("seq", "int64")
    func = only_primfunc(
        lambda bb, x, y: relax.op.nn.relu(bb.emit(relax.op.add(x, y))), {"x": (seq, 40), "y": (40,)}
    )
    kernel = Kernel(func, target)
    assert kernel.rule == "Elementwise"
    assert "T.vectorized" in kernel.script
    rng = np.random.default_rng(6)
    y = rng.standard_normal(40, dtype=np.float32)
    for rows in SIZES:
        x = rng.standard_normal((rows, 40), dtype=np.float32)
        kernel.check({"x": x, "y": y}, np.maximum(x + y, 0))


def test_head_split_transpose_with_symbolic_length(target):
    """``x[seq, 4, 64] -> [4, seq, 64] * 0.125`` (attention heads, scaled)."""
    seq = tirx.Var("seq", "int64")

    def build(bb, x):
        return relax.op.multiply(bb.emit(relax.op.permute_dims(x, [1, 0, 2])), relax.const(0.125, F32))

    kernel = Kernel(only_primfunc(build, {"x": (seq, 4, 64)}), target)
    assert kernel.rule == "Elementwise"
    assert "T.vectorized" in kernel.script
    rng = np.random.default_rng(7)
    for rows in SIZES:
        x = rng.standard_normal((rows, 4, 64), dtype=np.float32)
        kernel.check({"x": x}, x.transpose(1, 0, 2) * np.float32(0.125))


def _conv3x3_relu(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Stride-1, pad-1 NCHW convolution followed by relu, written as a sum of shifted products."""
    n, _, h, wd = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd), np.float32)
    for r in range(3):
        for q in range(3):
            out += np.einsum("nchw,fc->nfhw", padded[:, :, r : r + h, q : q + wd], w[:, :, r, q])
    return np.maximum(out, 0)


@pytest.mark.parametrize("symbolic", ["batch", "spatial"])
def test_conv2d_with_symbolic_batch_or_spatial_dims(target, symbolic):
    """A 3x3 conv + relu with a symbolic batch (the GEMM's S axis) or a symbolic image size
    (the im2col positions: N, padded to whole vectors)."""
    batch = tirx.Var("batch", "int64") if symbolic == "batch" else 2
    h, w_ = (tirx.Var("h", "int64"), tirx.Var("w", "int64")) if symbolic == "spatial" else (9, 11)

    def build(bb, x, w):
        return relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, w, padding=1)))

    kernel = Kernel(only_primfunc(build, {"x": (batch, 5, h, w_), "w": (8, 5, 3, 3)}), target)
    assert kernel.rule == "Conv2d"
    rng = np.random.default_rng(8)
    weight = rng.standard_normal((8, 5, 3, 3), dtype=np.float32)
    shapes = [(1, 9, 11), (3, 9, 11)] if symbolic == "batch" else [(2, 1, 1), (2, 7, 33), (2, 10, 3)]
    for n, rows, cols in shapes:
        x = rng.standard_normal((n, 5, rows, cols), dtype=np.float32)
        kernel.check({"x": x, "w": weight}, _conv3x3_relu(x, weight))
