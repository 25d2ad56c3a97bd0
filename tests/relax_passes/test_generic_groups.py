"""The generic grouping of FuseEmits: elementwise DAGs (a producer read several times)
join the group of their anchor when their values stay inside it, and only then."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import aicf_tvm
from aicf_tvm import emit_of

from ..conftest import run_vm
from ..helpers import last_hidden_state
from .helpers import special_floats
from .test_fuse_emits import fuse, fused_kinds

TARGET = {"kind": "llvm", "num-cores": 2}
SQRT_2_OVER_PI = float(np.sqrt(2 / np.pi))


def _gelu_tanh_reference(y: np.ndarray) -> np.ndarray:
    y = y.astype(np.float64)
    return 0.5 * y * (1 + np.tanh(SQRT_2_OVER_PI * (y + 0.044715 * y**3)))


def _const(value: float) -> relax.Constant:
    return relax.const(value, "float32")


def _gemm_gelu_tanh(extra: str = "") -> tvm.IRModule:
    """matmul + bias, then GPT-2's decomposed tanh-GELU (y read three times).

    ``extra``: "escape" also returns ``cube`` (an intermediate used outside the DAG);
    "sum" reduces ``cube`` after the activation (used outside, by a later reduction)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 32), "float32"))
    w = relax.Var("w", relax.TensorType((32, 64), "float32"))
    b = relax.Var("b", relax.TensorType((64,), "float32"))
    op = relax.op
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            y = bb.emit(op.add(bb.emit(op.matmul(x, w)), b))
            half = bb.emit(op.multiply(y, _const(0.5)))
            cube = bb.emit(op.power(y, _const(3.0)))
            inner = bb.emit(op.add(y, bb.emit(op.multiply(cube, _const(0.044715)))))
            t = bb.emit(op.tanh(bb.emit(op.multiply(inner, _const(SQRT_2_OVER_PI)))))
            out = bb.emit(op.multiply(half, bb.emit(op.add(t, _const(1.0)))))
            if extra == "escape":
                result = bb.emit_output(relax.Tuple([bb.emit(out), cube]))
            elif extra == "sum":
                result = bb.emit_output(relax.Tuple([out, bb.emit(op.sum(cube, axis=[1]))]))
            else:
                result = bb.emit_output(out)
        bb.emit_func_output(result)
    return bb.get()


def _operands(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal(s).astype("float32") for s in ((8, 32), (32, 64), (64,))]


def _gemm_members(mod: tvm.IRModule) -> list[str]:
    func = mod["fused_gemm_bias_act"]
    return [b.value.op.name for blk in func.body.blocks for b in blk.bindings]


def test_gelu_tanh_diamond_joins_the_gemm():
    """The whole tanh-GELU DAG becomes the epilogue of one fused_gemm_bias_act: every
    value it reads (y three times, half, cube) stays inside; the body inlines the members
    in order, so it matches numpy's float64 formula and the unoptimized build."""
    mod = _gemm_gelu_tanh()
    after, report = fuse(mod)
    assert fused_kinds(after) == ["fused_gemm_bias_act"]
    assert [p.name for p in emit_of(after["fused_gemm_bias_act"]).interface.outputs] == ["out"]
    assert _gemm_members(after).count("relax.power") == 1 and "relax.tanh" in _gemm_members(after)
    epilogue = [d for d in report.accepted if d.candidate == "epilogue"]
    assert len(epilogue) == 1 and len(epilogue[0].members) == 8
    assert "joins fused_gemm_bias_act" in epilogue[0].note
    args = _operands(np.random.default_rng(11))
    want = _gelu_tanh_reference(args[0].astype(np.float64) @ args[1] + args[2])
    np.testing.assert_allclose(run_vm(after, *args)[0], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run_vm(after, *args)[0], run_vm(mod, *args)[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("extra", ["escape", "sum"])
def test_dag_with_an_escaping_intermediate_is_not_absorbed(extra):
    """``cube`` is needed outside the DAG (a block output, or a later reduction found only
    after the DAG joined): absorbing the DAG would give the GEMM a second output, so the
    GEMM group keeps only matmul + bias (rolled back in the "sum" case), and the rest is
    grouped without it."""
    mod = _gemm_gelu_tanh(extra)
    after, report = fuse(mod)
    assert _gemm_members(after) == ["relax.matmul", "relax.add"]
    assert [p.name for p in emit_of(after["fused_gemm_bias_act"]).interface.outputs] == ["out"]
    assert not [d for d in report.accepted if d.candidate == "epilogue"]
    args = _operands(np.random.default_rng(12))
    y = args[0].astype(np.float64) @ args[1] + args[2]
    got = run_vm(after, *args)
    np.testing.assert_allclose(got[0], _gelu_tanh_reference(y), rtol=1e-5, atol=1e-6)
    cube = y**3 if extra == "escape" else (y**3).sum(axis=1)
    np.testing.assert_allclose(got[1], cube, rtol=1e-4, atol=1e-4)


def test_elementwise_diamond_is_one_group():
    """``e * sigmoid(e)`` with ``e = exp(x)``: e has two consumers, both in the group, so
    the three ops are one fused_elementwise (they were two groups and a lone exp); on ±0,
    ±inf and NaN it gives what the unoptimized build gives."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit(relax.op.exp(x))
            out = bb.emit_output(bb.emit(relax.op.multiply(e, bb.emit(relax.op.sigmoid(e)))))
        bb.emit_func_output(out)
    mod = bb.get()
    after, _ = fuse(mod)
    assert fused_kinds(after) == ["fused_elementwise"]
    fn = after["fused_elementwise"]
    assert [b.value.op.name for blk in fn.body.blocks for b in blk.bindings] == \
        ["relax.exp", "relax.sigmoid", "relax.multiply"]
    data = special_floats(np.random.default_rng(13), 64).reshape(4, 16)
    with np.errstate(over="ignore", invalid="ignore"):
        e64 = np.exp(data.astype(np.float64))
        want = e64 / (1 + np.exp(-e64))
    want[np.isinf(e64)] = np.inf
    np.testing.assert_allclose(run_vm(after, data)[0], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(aicf_tvm.compile(mod, target=TARGET)(data), want, rtol=1e-5, atol=1e-6)


# --- end to end, from PyTorch ----------------------------------------------------------


def _activations():
    torch = pytest.importorskip("torch")
    activations = pytest.importorskip("transformers.activations")

    class Fn(torch.nn.Module):
        def __init__(self, fn) -> None:
            super().__init__()
            self.fn = fn

        def forward(self, x):
            return self.fn(x)

    return {
        "gelu_new": activations.NewGELUActivation(),
        "quick_gelu": Fn(lambda x: x * torch.sigmoid(1.702 * x)),
        "silu": Fn(lambda x: x * torch.sigmoid(x)),
    }


@pytest.mark.parametrize("name", ["gelu_new", "quick_gelu", "silu"])
def test_torch_linear_with_a_decomposed_activation_is_one_kernel(name):
    """Linear + an activation torch.export writes out as a DAG over the Linear's output:
    one GEMM kernel, no elementwise pass, matching PyTorch; rows with +inf, -inf and NaN
    give the Linear's output ±inf/NaN, which the activation maps as PyTorch does."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(5)

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.act = torch.nn.Linear(64, 128), _activations()[name]

        def forward(self, x):
            return self.act(self.fc(x))

    model = Mlp().eval()
    rng = np.random.default_rng(14)
    x = rng.standard_normal((16, 64)).astype("float32")
    x[1, 3], x[2, 7], x[3, 0] = np.inf, -np.inf, np.nan
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(model, (torch.from_numpy(x),)), target=TARGET)
    assert [k.kind for k in compiled.kernels] == ["fused_gemm_bias_act"]
    assert any(d.candidate == "epilogue" for d in compiled.report.accepted)
    for data in (x, rng.standard_normal((16, 64)).astype("float32")):
        with torch.no_grad():
            want = model(torch.from_numpy(data)).numpy()
        np.testing.assert_allclose(compiled(data), want, rtol=1e-5, atol=1e-6)


def test_gpt2_mlp_activation_joins_the_c_fc_gemm():
    """GPT-2 (2 layers, random weights, the all-ones mask a tokenizer gives): each layer's
    tanh-GELU (after the view back to [1, seq, 4n]) is the epilogue of its c_fc GEMM, and
    the model matches PyTorch."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=2, n_positions=16)
    model = transformers.GPT2Model(cfg).eval()

    rng = np.random.default_rng(15)
    ids, other = (torch.from_numpy(rng.integers(0, 50, (1, 8))) for _ in range(2))
    mask = torch.ones((1, 8), dtype=torch.int64)
    wrapped = last_hidden_state(model)
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(wrapped, (ids, mask)), target=TARGET)
    gelu = [d for d in compiled.report.accepted
            if d.candidate == "epilogue" and "fused_gemm_bias_act" in d.note and len(d.members) >= 8]
    assert len(gelu) == 2
    with torch.no_grad():
        want, other_want = wrapped(ids, mask).numpy(), wrapped(other, mask).numpy()
    assert not np.allclose(want, other_want)
    np.testing.assert_allclose(compiled(ids.numpy(), mask.numpy()), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(compiled(other.numpy(), mask.numpy()), other_want, rtol=1e-4, atol=1e-5)
