"""FuseEmits: library candidates and generic groups, each decided on lattice facts."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from aicf_tvm import EMIT_ATTR, emit_of, verify_contracts
from aicf_tvm.core.candidate import port_requirement
from aicf_tvm.core.contract import ContractFacts, PortFacts
from aicf_tvm.core.lattice import Alias, Effect, ShapeFact
from aicf_tvm.core.report import FusionReport
from aicf_tvm.library import DEFAULT_CANDIDATES, Candidate, gemm_candidate
from aicf_tvm.library.gemm import gemm_variants
from relax_passes import FuseEmits, LiftEmits, PropagateContracts

from ..conftest import run_vm
from .helpers import strip_emits


def lifted(mod: tvm.IRModule) -> tvm.IRModule:
    return PropagateContracts()(LiftEmits()(mod))


def fuse(mod: tvm.IRModule, candidates=DEFAULT_CANDIDATES) -> tuple[tvm.IRModule, FusionReport]:
    report = FusionReport()
    out = PropagateContracts()(FuseEmits(tuple(candidates), report=report)(lifted(mod)))
    verify_contracts(out)
    return out, report


def fused_kinds(mod: tvm.IRModule) -> list[str]:
    return sorted(emit_of(f).kind for gv, f in mod.functions_items()
                  if isinstance(f, relax.Function) and emit_of(f) is not None)


def assert_same_numbers(before, after, *shapes, dtype="float32", rtol=1e-5, atol=1e-6):
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(dtype) for s in shapes]
    for got, want in zip(run_vm(after, *args), run_vm(before, *args)):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    # and against numpy where the test gives a reference
    return args


@I.ir_module
class GemmBiasRelu:
    @R.function
    def main(x: R.Tensor((8, 32), "float32"), w: R.Tensor((32, 16), "float32"), b: R.Tensor((16,), "float32")):
        with R.dataflow():
            y = R.matmul(x, w)
            z = R.add(y, b)
            r = R.nn.relu(z)
            R.output(r)
        return r


@I.ir_module
class GemmBiasReluExpected:
    @R.function(private=True)
    def fused_gemm_bias_act(p0: R.Tensor((8, 32), "float32"), p1: R.Tensor((32, 16), "float32"),
                            p2: R.Tensor((16,), "float32")) -> R.Tensor((8, 16), "float32"):
        R.func_attr({"Primitive": True})
        with R.dataflow():
            gv = R.matmul(p0, p1)
            gv1 = R.add(gv, p2)
            gv2 = R.nn.relu(gv1)
            R.output(gv2)
        return gv2

    @R.function
    def main(x: R.Tensor((8, 32), "float32"), w: R.Tensor((32, 16), "float32"), b: R.Tensor((16,), "float32")):
        cls = GemmBiasReluExpected
        with R.dataflow():
            r = cls.fused_gemm_bias_act(x, w, b)
            R.output(r)
        return r


class TestGemmBiasAct:
    """matmul + bias + relu is one fused_gemm_bias_act whose body inlines the three ops
    in order, so it computes exactly what they did."""

    def test_structure(self):
        after, report = fuse(GemmBiasRelu)
        tvm.ir.assert_structural_equal(strip_emits(after), GemmBiasReluExpected)
        assert [d.candidate for d in report.accepted] == ["fused_gemm_bias_act"]

    def test_contract_and_config(self):
        after, _ = fuse(GemmBiasRelu)
        emit = emit_of(after["fused_gemm_bias_act"])
        assert emit.attr_dict["activation"] == "relu" and emit.attr_dict["has_bias"] is True
        assert [p.name for p in emit.interface.inputs] == ["a", "b", "bias"]
        assert emit.contract.provides.port("out").effect == Effect("Write")
        assert emit.contract.requires.port("bias").shape == ShapeFact.shape([16])

    def test_numbers_match_numpy(self):
        after, _ = fuse(GemmBiasRelu)
        x, w, b = assert_same_numbers(GemmBiasRelu, after, (8, 32), (32, 16), (16,))
        np.testing.assert_allclose(run_vm(after, x, w, b)[0], np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)

    def test_idempotent(self):
        once, _ = fuse(GemmBiasRelu)
        twice = PropagateContracts()(FuseEmits()(once))
        tvm.ir.assert_structural_equal(twice, once)


@I.ir_module
class Attention:
    @R.function
    def main(q: R.Tensor((2, 4, 16, 8), "float32"), k: R.Tensor((2, 4, 16, 8), "float32"),
             v: R.Tensor((2, 4, 16, 8), "float32"), mask: R.Tensor((1, 1, 16, 16), "float32")):
        with R.dataflow():
            kt = R.permute_dims(k, [0, 1, 3, 2])
            s = R.matmul(q, kt)
            s2 = R.multiply(s, R.const(0.35, "float32"))
            s3 = R.add(s2, mask)
            p = R.nn.softmax(s3, axis=-1)
            o = R.matmul(p, v)
            R.output(o)
        return o


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


class TestAttention:
    """Two matmuls and the softmax's two reductions in one Emit: TVM's FuseOps gives 3+."""

    def test_one_emit(self):
        after, _report = fuse(Attention)
        assert fused_kinds(after) == ["fused_attention"]
        emit = emit_of(after["fused_attention"])
        assert {"q", "k", "v", "mask", "scale"} == {p.name for p in emit.interface.inputs}
        assert emit.attr_dict["has_mask"] and emit.attr_dict["has_scale"]

    def test_numbers_match_numpy(self):
        after, _ = fuse(Attention)
        q, k, v, m = assert_same_numbers(Attention, after, (2, 4, 16, 8), (2, 4, 16, 8), (2, 4, 16, 8), (1, 1, 16, 16))
        want = _softmax(q @ k.transpose(0, 1, 3, 2) * np.float32(0.35) + m) @ v
        np.testing.assert_allclose(run_vm(after, q, k, v, m)[0], want, rtol=1e-5, atol=1e-5)

    def test_softmax_over_another_axis_is_refused(self):
        mod = Attention.script().replace("axis=-1", "axis=2")
        after, report = fuse(tvm.script.from_source(mod))
        refused = [d for d in report.refused if d.candidate == "fused_attention"]
        assert refused and "softmax axis 2 is not the last axis" in refused[0].note
        assert "fused_attention" not in fused_kinds(after)


@I.ir_module
class WrittenOutSoftmax:
    @R.function
    def main(x: R.Tensor((4, 32), "float32")):
        with R.dataflow():
            m = R.max(x, axis=[-1], keepdims=True)
            d = R.subtract(x, m)
            e = R.exp(d)
            s = R.sum(e, axis=[-1], keepdims=True)
            y = R.divide(e, s)
            R.output(y)
        return y


@I.ir_module
class WrittenOutLayerNorm:
    @R.function
    def main(x: R.Tensor((4, 32), "float32"), g: R.Tensor((32,), "float32"), b: R.Tensor((32,), "float32")):
        with R.dataflow():
            mu = R.mean(x, axis=[-1], keepdims=True)
            d = R.subtract(x, mu)
            sq = R.multiply(d, d)
            var = R.mean(sq, axis=[-1], keepdims=True)
            ve = R.add(var, R.const(1e-5, "float32"))
            sd = R.sqrt(ve)
            n = R.divide(d, sd)
            y = R.add(R.multiply(n, g), b)
            R.output(y)
        return y


@I.ir_module
class WrittenOutRMSNorm:
    @R.function
    def main(x: R.Tensor((4, 32), "float32"), g: R.Tensor((32,), "float32")):
        with R.dataflow():
            sq = R.multiply(x, x)
            ms = R.mean(sq, axis=[-1], keepdims=True)
            ve = R.add(ms, R.const(1e-6, "float32"))
            r = R.rsqrt(ve)
            n = R.multiply(x, r)
            y = R.multiply(n, g)
            R.output(y)
        return y


@pytest.mark.parametrize("mod,kind,ref,shapes", [
    (WrittenOutSoftmax, "fused_softmax", lambda x: _softmax(x), [(4, 32)]),
    (WrittenOutLayerNorm, "fused_layernorm",
     lambda x, g, b: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b,
     [(4, 32), (32,), (32,)]),
    (WrittenOutRMSNorm, "fused_rmsnorm",
     lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g, [(4, 32), (32,)]),
])
def test_written_out_norms_become_one_emit(mod, kind, ref, shapes):
    """Two reductions (max+sum, mean+variance, mean of squares + scale) in one Emit."""
    after, _ = fuse(mod)
    assert fused_kinds(after) == [kind]
    args = assert_same_numbers(mod, after, *shapes)
    np.testing.assert_allclose(run_vm(after, *args)[0], ref(*args), rtol=1e-4, atol=1e-5)


@I.ir_module
class ElementwiseChain:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), y: R.Tensor((8,), "float32")):
        with R.dataflow():
            a = R.add(x, y)
            b = R.nn.silu(a)
            c = R.permute_dims(b, [1, 0])
            d = R.reshape(c, (32,))
            R.output(d)
        return d


def test_elementwise_and_view_chain_is_one_emit():
    after, _report = fuse(ElementwiseChain)
    assert fused_kinds(after) == ["fused_elementwise"]
    x, y = assert_same_numbers(ElementwiseChain, after, (4, 8), (8,))
    a = x + y
    np.testing.assert_allclose(run_vm(after, x, y)[0], (a / (1 + np.exp(-a))).T.reshape(32), rtol=1e-5, atol=1e-6)


@I.ir_module
class ResidualBiasNotPerColumn:
    @R.function
    def main(x: R.Tensor((8, 32), "float32"), w: R.Tensor((32, 16), "float32"), b: R.Tensor((8, 16), "float32")):
        with R.dataflow():
            y = R.matmul(x, w)
            z = R.add(y, b)
            R.output(z)
        return z


def test_shape_rejection_names_component_and_values():
    """A full [8,16] addend is not a per-column bias: the bias variant is refused on the
    shape lattice; the residual variant (same shape as the output) is taken instead."""
    _, report = fuse(ResidualBiasNotPerColumn, [gemm_candidate()])
    [decision] = report.decisions
    assert decision.accepted  # as a residual add
    only_bias = Candidate("fused_gemm_bias_act", lambda: [v for v in gemm_variants() if "residual" not in v[1]],
                          requires=gemm_candidate().requires)
    _, report = fuse(ResidualBiasNotPerColumn, [only_bias])
    [decision] = [d for d in report.decisions if d.candidate == "fused_gemm_bias_act"]
    assert not decision.accepted
    assert "bias.shape: [8x16] contiguous ⋢ [1x16] required by fused_gemm_bias_act" in str(decision)


@I.ir_module
class TransposedInput:
    @R.function
    def main(x: R.Tensor((32, 8), "float32"), w: R.Tensor((32, 16), "float32"), b: R.Tensor((16,), "float32")):
        with R.dataflow():
            xt = R.permute_dims(x, [1, 0])
            y = R.matmul(xt, w)
            z = R.add(y, b)
            R.output(z)
        return z


def test_stride_rejection_when_contiguity_is_required():
    """A candidate that requires its A operand contiguous is refused when A is a transposed
    view: the stride facts show it, with both values in the reason."""
    def requires(m):
        a = m.shapes["a"]
        return port_requirement(a=ShapeFact.contiguous(a.dims))

    cand = Candidate("fused_gemm_bias_act", gemm_variants, requires=requires, label="packed_gemm")
    _, report = fuse(TransposedInput, [cand])
    [decision] = [d for d in report.decisions if d.candidate == "packed_gemm"]
    assert not decision.accepted
    assert "a.shape: [8x32] strides(1,8) ⋢ [8x32] contiguous required by packed_gemm" in str(decision)


def test_alias_rejection_when_no_alias_is_required():
    """Two caller inputs may be the same buffer (Unknown): a candidate needing NoAlias
    between them is refused on the alias lattice."""
    def requires(m):
        return ContractFacts.of(alias={("a", "bias"): Alias("NoAlias")})

    cand = Candidate("fused_gemm_bias_act", gemm_variants, requires=requires, label="inplace_gemm")
    _, report = fuse(GemmBiasRelu, [cand])
    decisions = [d for d in report.decisions if d.candidate == "inplace_gemm"]
    assert decisions and not any(d.accepted for d in decisions)
    assert "alias(a, bias): Unknown ⋢ NoAlias required by inplace_gemm" in str(decisions[0])


def test_effect_rejection_when_a_member_writes_its_input():
    """An Emit whose contract says it writes its input (ReadWrite) cannot be fused."""
    mod = lifted(GemmBiasRelu)
    emit = emit_of(mod["emit_add"])
    port = emit.contract.provides.port("x1")
    writes = emit.contract.provides.with_port("x1", PortFacts(Effect("ReadWrite"), port.shape, port.numeric, port.abi))
    mod["emit_add"] = mod["emit_add"].with_attr(EMIT_ATTR, emit.with_contract(
        type(emit.contract)(emit.contract.requires, writes)).to_attr())
    report = FusionReport()
    after = FuseEmits(report=report)(mod)
    assert not report.accepted
    assert any("z.x1.effect: ReadWrite ⋢ Read" in str(d) for d in report.refused)
    assert "fused_gemm_bias_act" not in fused_kinds(after)


@I.ir_module
class HalfGemmFloatAcc:
    @R.function
    def main(x: R.Tensor((8, 32), "float16"), w: R.Tensor((32, 16), "float16"), b: R.Tensor((16,), "float32")):
        with R.dataflow():
            y = R.matmul(x, w, out_dtype="float32")
            z = R.add(y, b)
            R.output(z)
        return z


def test_numeric_policy_refuses_weaker_accumulation():
    """float16 matmul accumulating in float32 + bias: a float16-accumulating candidate is
    refused with the numeric reason; the float32 one is taken."""
    f16 = gemm_candidate(accumulation="float16", label="fused_gemm_bias_act(acc=float16)", priority=99)
    f32 = gemm_candidate(accumulation="float32", label="fused_gemm_bias_act(acc=float32)", priority=98)
    after, report = fuse(HalfGemmFloatAcc, [f16, f32])
    refused = [d for d in report.decisions if d.candidate.endswith("float16)")]
    assert refused and not refused[0].accepted
    assert "numeric.accumulation: float16 ⋢ float32 required by fused_gemm_bias_act(acc=float16)" in str(refused[0])
    taken = [d for d in report.accepted]
    assert [d.candidate for d in taken] == ["fused_gemm_bias_act(acc=float32)"]
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal(s).astype("float16") for s in ((8, 32), (32, 16)))
    b = rng.standard_normal(16).astype("float32")
    want = x.astype(np.float32) @ w.astype(np.float32) + b
    np.testing.assert_allclose(run_vm(after, x, w, b)[0], want, rtol=1e-3, atol=1e-3)


def test_module_without_candidates_is_unchanged():
    @I.ir_module
    class Single:
        @R.function
        def main(x: R.Tensor((4,), "float32")):
            with R.dataflow():
                y = R.nn.relu(x)
                R.output(y)
            return y

    mod = lifted(Single)
    tvm.ir.assert_structural_equal(FuseEmits()(mod), mod)


def test_multi_consumer_intermediate_is_exported():
    """A matmul whose result is also a block output still fuses with its bias add; the
    fused Emit returns both values (the intermediate is needed outside), and ``u``, which
    reads both, stays outside (the group is closed: joining would make a third output)."""
    @I.ir_module
    class Shared:
        @R.function
        def main(x: R.Tensor((8, 32), "float32"), w: R.Tensor((32, 16), "float32"), b: R.Tensor((16,), "float32")):
            with R.dataflow():
                y = R.matmul(x, w)
                z = R.add(y, b)
                u = R.multiply(y, z)
                R.output(u, y)
            return (u, y)

    after, _report = fuse(Shared)
    assert "fused_gemm_bias_act" in fused_kinds(after)
    emit = emit_of(after["fused_gemm_bias_act"])
    assert [p.name for p in emit.interface.outputs] == ["out.0", "out.1"]
    assert_same_numbers(Shared, after, (8, 32), (32, 16), (16,))


def _conv_block(stride: int, groups: int, cin: int, cout: int):
    rng = np.random.default_rng(3)
    w = relax.const(rng.standard_normal((cout, cin // groups, 3, 3)).astype("float32") * 0.2)
    b = relax.const(rng.standard_normal((1, cout, 1, 1)).astype("float32"))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, cin, 15, 15), "float32"))
    r = relax.Var("r", relax.TensorType((1, cout, (15 + 2 - 3) // stride + 1, (15 + 2 - 3) // stride + 1), "float32"))
    with bb.function("main", [x, r]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=1, groups=groups))
            c = bb.emit(relax.op.add(c, b))
            c = bb.emit(relax.op.add(c, r))
            out = bb.emit_output(bb.emit(relax.op.nn.relu(c)))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("stride,groups,cin,cout", [(1, 1, 8, 16), (2, 1, 8, 16), (1, 8, 8, 8)])
def test_conv_bias_residual_relu_is_one_emit_and_compiles_right(stride, groups, cin, cout):
    """conv2d + bias + residual + relu (ResNet's tail) is one fused_conv2d_bias_act; with
    random weights it matches the unoptimized TVM build, fused and scheduled alike."""
    import aicf_tvm

    mod = _conv_block(stride, groups, cin, cout)
    after, _ = fuse(mod)
    assert fused_kinds(after) == ["fused_conv2d_bias_act"]
    emit = emit_of(after["fused_conv2d_bias_act"])
    assert emit.attr_dict["has_residual"] and emit.attr_dict["post_activation"] == "relu"
    rng = np.random.default_rng(4)
    args = [rng.standard_normal([int(d) for d in p.ty.shape.values]).astype("float32") for p in mod["main"].params]
    want = run_vm(mod, *args)[0]
    np.testing.assert_allclose(run_vm(after, *args)[0], want, rtol=1e-5, atol=1e-5)
    compiled = aicf_tvm.compile(mod, target={"kind": "llvm", "num-cores": 2})
    assert [k.kind for k in compiled.kernels] == ["fused_conv2d_bias_act"]
    np.testing.assert_allclose(compiled(*args), want, rtol=1e-4, atol=1e-4)
