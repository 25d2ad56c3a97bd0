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


# --- symbolic row counts: Linear's [B*S, N] -> [B, S, N] view inside a GEMM group -------

_K, _N = 24, 40
_BINDINGS = ((1, 1), (1, 7), (2, 32))  # (b, s): GEMM rows M = b * s = 1, 7, 64


def _llama_mlp() -> tvm.IRModule:
    """LLaMA's MLP over symbolic ``b``, ``s``: ``x + down(silu(gate(h)) * up(h))`` with each
    GEMM on ``[b * s, k]`` rows and its output viewed back as ``[b, s, n]``."""
    b, s = tvm.tirx.Var("b", "int64"), tvm.tirx.Var("s", "int64")
    op = relax.op
    x = relax.Var("x", relax.TensorType((b, s, _K), "float32"))
    ws = [relax.Var(n, relax.TensorType(sh, "float32"))
          for n, sh in (("w_gate", (_K, _N)), ("w_up", (_K, _N)), ("w_down", (_N, _K)))]
    bb = relax.BlockBuilder()
    with bb.function("main", [x, *ws]):
        with bb.dataflow():
            h = bb.emit(op.reshape(x, (b * s, _K)))
            gate = bb.emit(op.reshape(bb.emit(op.matmul(h, ws[0])), (b, s, _N)))
            up = bb.emit(op.reshape(bb.emit(op.matmul(h, ws[1])), (b, s, _N)))
            act = bb.emit(op.multiply(bb.emit(op.multiply(gate, bb.emit(op.sigmoid(gate)))), up))
            rows = bb.emit(op.reshape(act, (b * s, _N)))
            down = bb.emit(op.reshape(bb.emit(op.matmul(rows, ws[2])), (b, s, _K)))
            out = bb.emit_output(bb.emit(op.add(x, down)))
        bb.emit_func_output(out)
    return bb.get()


def _mlp_reference(x, w_gate, w_up, w_down) -> np.ndarray:
    h = x.astype(np.float64).reshape(-1, _K)
    g = h @ w_gate
    with np.errstate(over="ignore", invalid="ignore"):
        return x + (g / (1 + np.exp(-g)) * (h @ w_up) @ w_down).reshape(x.shape)


def _gemm_kernels(compiled) -> list[str]:
    return [k.kind for k in compiled.kernels if k.kind in {"matmul", "fused_reduce_epilogue",
                                                            "fused_gemm_bias_act", "fused_elementwise"}]


def test_symbolic_rows_epilogues_join_their_gemms():
    """With symbolic ``b``, ``s`` the epilogues join their GEMMs as with static shapes:
    ``silu(gate) * up`` joins the gate GEMM, ``x + down`` the down GEMM, through the view
    ``[b * s, n] -> [b, s, n]`` (its vars defined by ``up`` and ``x``, inputs of the groups;
    its element count proven equal), so no elementwise kernel is left. One build serves
    M = 1, 7, 64, matching numpy in float64 and the unoptimized TVM build; a row of x with
    +inf, -inf and NaN spreads as it does there."""
    mod = _llama_mlp()
    compiled = aicf_tvm.compile(mod, target=TARGET)
    assert sorted(_gemm_kernels(compiled)) == ["fused_reduce_epilogue", "fused_reduce_epilogue", "matmul"]
    groups = [d for d in compiled.report.accepted if d.candidate == "fused_reduce_epilogue"]
    assert sorted(len(d.members) for d in groups) == [3, 5]  # matmul, view, add / matmul, view, silu, *up
    rng = np.random.default_rng(21)
    for b, s in _BINDINGS:
        shapes = ((b, s, _K), (_K, _N), (_K, _N), (_N, _K))
        args = [rng.standard_normal(sh).astype("float32") for sh in shapes]
        if b * s == 64:
            args[0][1, 3, :3] = np.inf, -np.inf, np.nan
        got = compiled(*args)
        np.testing.assert_allclose(got, _mlp_reference(*args), rtol=1e-4, atol=1e-4, err_msg=f"b={b}, s={s}")
        np.testing.assert_allclose(got, run_vm(mod, *args)[0], rtol=1e-4, atol=1e-4, err_msg=f"b={b}, s={s}")
    assert np.isnan(got[1, 3]).all() and np.isfinite(got[0]).all()


def test_view_of_an_unproven_row_count_stays_outside():
    """``x + reshape(y @ w, [b, s, k])`` with ``y: [m, n]``: nothing proves ``m == b * s``
    (Relax accepts the reshape since the counts do not provably differ), and the GEMM's
    kernel would walk its rows as ``[b, s]``, so neither the view nor the residual add
    behind it joins the GEMM; where the bindings agree the result is right."""
    b, s, m = (tvm.tirx.Var(n, "int64") for n in ("b", "s", "m"))
    x = relax.Var("x", relax.TensorType((b, s, _K), "float32"))
    y = relax.Var("y", relax.TensorType((m, _N), "float32"))
    w = relax.Var("w", relax.TensorType((_N, _K), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y, w]):
        with bb.dataflow():
            down = bb.emit(relax.op.reshape(bb.emit(relax.op.matmul(y, w)), (b, s, _K)))
            out = bb.emit_output(bb.emit(relax.op.add(x, down)))
        bb.emit_func_output(out)
    compiled = aicf_tvm.compile(bb.get(), target=TARGET)
    kinds = [k.kind for k in compiled.kernels]
    assert kinds.count("matmul") == 1 and "add" in kinds and "fused_reduce_epilogue" not in kinds
    refused = [d for d in compiled.report.refused if d.candidate == "epilogue"]
    assert len(refused) == 1 and "element counts not proven" in refused[0].note
    rng = np.random.default_rng(22)
    for bind_b, bind_s in _BINDINGS:
        shapes = ((bind_b, bind_s, _K), (bind_b * bind_s, _N), (_N, _K))
        args = [rng.standard_normal(sh).astype("float32") for sh in shapes]
        want = args[0] + (args[1].astype(np.float64) @ args[2]).reshape(args[0].shape)
        np.testing.assert_allclose(compiled(*args), want, rtol=1e-4, atol=1e-4)


def test_view_naming_vars_no_input_defines_stays_outside():
    """GEMM, view to ``[b, s, n]``, silu, and nothing else: the group's inputs are
    ``[b * s, k]`` and the weight, which define neither ``b`` nor ``s``, so the view (and
    the silu after it) stays out of the GEMM's kernel; the result matches numpy."""
    b, s = tvm.tirx.Var("b", "int64"), tvm.tirx.Var("s", "int64")
    op = relax.op
    x = relax.Var("x", relax.TensorType((b, s, _K), "float32"))
    w = relax.Var("w", relax.TensorType((_K, _N), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            g = bb.emit(op.reshape(bb.emit(op.matmul(bb.emit(op.reshape(x, (b * s, _K))), w)), (b, s, _N)))
            out = bb.emit_output(bb.emit(op.multiply(g, bb.emit(op.sigmoid(g)))))
        bb.emit_func_output(out)
    compiled = aicf_tvm.compile(bb.get(), target=TARGET)
    assert sorted(_gemm_kernels(compiled)) == ["fused_elementwise", "matmul"]
    refused = [d for d in compiled.report.refused if d.candidate == "epilogue"]
    assert len(refused) == 1 and "names b, s, which no input of the group defines" in refused[0].note
    rng = np.random.default_rng(23)
    for bind_b, bind_s in _BINDINGS:
        args = [rng.standard_normal(sh).astype("float32") for sh in ((bind_b, bind_s, _K), (_K, _N))]
        g64 = args[0].astype(np.float64) @ args[1]
        np.testing.assert_allclose(compiled(*args), g64 / (1 + np.exp(-g64)), rtol=1e-4, atol=1e-5)
