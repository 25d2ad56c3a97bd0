"""EliminateEmits: each rule removes an Emit only when its fact is proven."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import aicf_tvm
from aicf_tvm import emit_of, verify_contracts
from aicf_tvm.core.elimination import compose_permutations, is_neutral_operand, represents_exactly
from aicf_tvm.core.report import FusionReport
from relax_passes import EliminateEmits, LiftEmits, MaterializeEmits, PropagateContracts

from ..conftest import run_vm
from ..helpers import relax_main
from .helpers import assert_same_values, special_floats


def eliminate(mod):
    report = FusionReport()
    out = PropagateContracts()(EliminateEmits(report=report)(PropagateContracts()(LiftEmits()(mod))))
    verify_contracts(out)
    return out, report


def kinds(mod) -> list[str]:
    return sorted(emit_of(f).kind for _, f in mod.functions_items()
                  if isinstance(f, relax.Function) and emit_of(f) is not None)


def same_numbers(before, after, *shapes, dtype="float32"):
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(dtype) for s in shapes]
    for got, want in zip(run_vm(after, *args), run_vm(before, *args)):
        np.testing.assert_array_equal(got, want)


def test_represents_exactly_table():
    assert represents_exactly("float16", "float32") and represents_exactly("int8", "float32")
    assert not represents_exactly("float32", "float16") and not represents_exactly("int32", "float32")
    assert compose_permutations([0, 2, 1], [0, 2, 1]) == [0, 1, 2]


@I.ir_module
class IdentityOps:
    @R.function
    def main(x: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            a = R.reshape(x, (4, 8))
            b = R.permute_dims(a, [0, 1])
            c = R.astype(b, "float32")
            d = R.add(c, R.const(-np.zeros((8,), "float32")))  # x + (-0.0) == x, -0.0 included
            e = R.multiply(d, R.const(1.0, "float32"))
            g = R.concat((e,), axis=0)  # a key/value cache's cat of an empty past, exported
            f = R.nn.relu(g)
            R.output(f)
        return f


@I.ir_module
class IdentityOpsExpected:
    @R.function(private=True)
    def emit_relu(x: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        R.func_attr({"Primitive": True})
        with R.dataflow():
            gv = R.nn.relu(x)
            R.output(gv)
        return gv

    @R.function
    def main(x: R.Tensor((4, 8), "float32")):
        cls = IdentityOpsExpected
        with R.dataflow():
            f = cls.emit_relu(x)
            R.output(f)
        return f


class TestIdentities:
    """Same-shape reshape, identity permutation, same-dtype cast, x+(-0.0), x*1 and a
    concat of one tensor all go: each returns its input unchanged."""

    def test_structure(self):
        from .helpers import strip_emits

        after, report = eliminate(IdentityOps)
        tvm.ir.assert_structural_equal(strip_emits(after), IdentityOpsExpected)
        rules = sorted(d.candidate for d in report.accepted)
        assert rules == ["eliminate:add", "eliminate:astype", "eliminate:concat", "eliminate:multiply",
                         "eliminate:permute_dims", "eliminate:reshape"]

    def test_numbers(self):
        after, _ = eliminate(IdentityOps)
        same_numbers(IdentityOps, after, (4, 8))

    def test_idempotent(self):
        once, _ = eliminate(IdentityOps)
        tvm.ir.assert_structural_equal(EliminateEmits()(once), once)


@I.ir_module
class AddBroadcastingZero:
    @R.function
    def main(x: R.Tensor((8,), "float32")):
        with R.dataflow():
            y = R.add(x, R.const(np.zeros((4, 8), "float32")))  # broadcasts x to [4, 8]
            R.output(y)
        return y


def test_neutral_constant_that_broadcasts_is_kept():
    after, report = eliminate(AddBroadcastingZero)
    assert kinds(after) == ["add"] and not report.accepted


def test_neutral_operands_are_matched_bit_for_bit():
    """x + (-0.0) and x - 0.0 keep every x; x + 0.0 turns -0.0 into +0.0, x - (-0.0) too;
    a NaN constant is neutral for nothing; for integers both zeros are 0."""
    f32 = lambda v: R.const(np.float32(v))
    assert is_neutral_operand("add", f32(-0.0), right=True) and is_neutral_operand("add", f32(-0.0), right=False)
    assert not is_neutral_operand("add", f32(0.0), right=True) and not is_neutral_operand("add", f32(0.0), right=False)
    assert is_neutral_operand("subtract", f32(0.0), right=True)
    assert not is_neutral_operand("subtract", f32(-0.0), right=True)
    assert not is_neutral_operand("subtract", f32(0.0), right=False)  # 0 - x is not x
    assert is_neutral_operand("multiply", f32(1.0), right=False) and is_neutral_operand("divide", f32(1.0), True)
    assert not is_neutral_operand("divide", f32(1.0), right=False)
    assert not is_neutral_operand("multiply", f32(0.0), right=True)
    assert not any(is_neutral_operand(k, f32("nan"), side) for k in ("add", "subtract", "multiply", "divide")
                   for side in (True, False))
    assert is_neutral_operand("add", R.const(np.int32(0)), right=True)
    assert not is_neutral_operand("add", R.const(np.array([-0.0, 0.0], "float32")), right=True)


@I.ir_module
class SignedZeroAdds:
    @R.function
    def main(x: R.Tensor((16,), "float32")):
        with R.dataflow():
            one = R.const(1.0, "float32")
            a = R.divide(one, R.add(x, R.const(0.0, "float32")))  # stays: 1/(-0.0 + 0.0) = +inf
            b = R.divide(one, R.add(R.const(np.zeros(16, "float32")), x))  # stays
            c = R.divide(one, R.subtract(x, R.const(-0.0, "float32")))  # stays
            d = R.divide(one, R.add(x, R.const(-0.0, "float32")))  # goes
            e = R.divide(one, R.subtract(x, R.const(0.0, "float32")))  # goes
            f = R.multiply(x, R.const(0.0, "float32"))  # never an identity (inf * 0 = NaN)
            g = R.add(x, R.const(np.float32("nan")))
            R.output(a, b, c, d, e, f, g)
        return (a, b, c, d, e, f, g)


def _signed_zero_reference(x):
    with np.errstate(all="ignore"):
        z = np.float32(0.0)
        return [1 / (x + z), 1 / (z + x), 1 / (x - -z), 1 / (x + -z), 1 / (x - z), x * z, x + np.float32("nan")]


def test_only_ieee_identities_are_eliminated():
    """Only x + (-0.0) and x - 0.0 go; the results keep the sign of every zero (numpy)."""
    after, report = eliminate(SignedZeroAdds)
    notes = sorted(d.note.split(":")[0] for d in report.accepted
                   if d.candidate in ("eliminate:add", "eliminate:subtract"))
    assert notes == ["x add -0.0", "x subtract 0.0"]
    x = special_floats(np.random.default_rng(0), 16)
    for got, want in zip(run_vm(after, x), _signed_zero_reference(x)):
        assert_same_values(got, want)


def test_compiled_signed_zero_adds_match_numpy():
    compiled = aicf_tvm.compile(SignedZeroAdds, target={"kind": "llvm", "num-cores": 2})
    x = special_floats(np.random.default_rng(1), 16)
    for got, want in zip(compiled(x), _signed_zero_reference(x)):
        assert_same_values(got, want)


@I.ir_module
class InversePermutes:
    @R.function
    def main(x: R.Tensor((2, 3, 4), "float32")):
        with R.dataflow():
            a = R.permute_dims(x, [0, 2, 1])
            b = R.permute_dims(a, [0, 2, 1])
            c = R.nn.relu(b)
            R.output(c)
        return c


def test_inverse_permutes_cancel_where_tvm_keeps_them():
    after, _report = eliminate(InversePermutes)
    assert kinds(after) == ["relu"]
    same_numbers(InversePermutes, after, (2, 3, 4))
    # TVM's own pipeline keeps both transposes (as a fused copy kernel).
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    with target:
        theirs = tvm.transform.Sequential([*cpu.legalize_passes(target)])(InversePermutes)
    assert any("transpose" in gv.name_hint for gv in theirs.get_global_vars())
    compiled = aicf_tvm.compile(InversePermutes, target={"kind": "llvm", "num-cores": 2})
    assert [k.kind for k in compiled.kernels] == ["relu"]


@I.ir_module
class CastPairs:
    @R.function
    def main(h: R.Tensor((8,), "float16"), f: R.Tensor((8,), "float32")):
        with R.dataflow():
            a = R.astype(h, "float32")
            b = R.astype(a, "float16")  # f16 -> f32 -> f16: exact, goes
            c = R.astype(f, "float16")
            d = R.astype(c, "float32")  # f32 -> f16 -> f32: rounds, stays
            R.output(b, d)
        return (b, d)


def test_cast_pairs():
    after, report = eliminate(CastPairs)
    assert kinds(after) == ["astype", "astype"]  # only f -> f16 -> f32 remains
    refused = [str(d) for d in report.refused if d.candidate == "eliminate:astype"]
    assert refused and "float32->float16" in refused[0]
    rng = np.random.default_rng(0)
    h = rng.standard_normal(8).astype("float16")
    f = (rng.standard_normal(8) * 1000 + 0.1).astype("float32")
    b, d = run_vm(after, h, f)
    np.testing.assert_array_equal(b, h)
    np.testing.assert_array_equal(d, f.astype("float16").astype("float32"))  # still rounds


@I.ir_module
class ReshapeViews:
    @R.function
    def main(x: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            a = R.reshape(x, (32,))  # x is contiguous: a view
            t = R.permute_dims(x, [1, 0])
            b = R.reshape(t, (32,))  # t is a transposed view: not a view
            R.output(a, b)
        return (a, b)


def test_reshape_of_contiguous_becomes_view_but_not_of_transposed():
    after, report = eliminate(ReshapeViews)
    assert kinds(after) == ["permute_dims", "reshape"]  # b's reshape stays an Emit
    refused = [str(d) for d in report.refused]
    assert any("b.x.shape: [8x4] strides(1,8) ⋢ [8x4] contiguous" in r for r in refused)
    same_numbers(ReshapeViews, after, (4, 8))


@I.ir_module
class SymbolicViews:
    @R.function
    def main(x: R.Tensor(("n", 8), "float32"), y: R.Tensor(("m", 8), "float32")):
        n, m = T.int64(), T.int64()
        with R.dataflow():
            a = R.reshape(x, R.shape([n * 2, 4]))  # x is contiguous: a view for every n
            t = R.permute_dims(a, [1, 0])
            b = R.expand_dims(t, [0])  # of a transpose: a copy for every n but 1
            c = R.astype(y, "float32")  # identity for every m
            d = R.reshape(R.reshape(y, R.shape([m * 8])), R.shape([m, 8]))  # back to y's shape
            R.output(a, b, c, d)
        return (a, b, c, d)


def test_views_of_symbolic_shapes_are_decided_for_every_binding():
    """Contiguity, identity casts and view chains proven with symbolic dims hold for every
    binding of them: the same rules as for static shapes, none for the transpose."""
    after, report = eliminate(SymbolicViews)
    assert kinds(after) == ["expand_dims", "permute_dims"]  # only b's copy and the transpose
    assert any("b.x.shape: [4x2*n] strides(1,4) ⋢ [4x2*n] contiguous" in str(d) for d in report.refused)
    accepted = [d.note for d in report.accepted]
    assert any("reshape of [nx8] contiguous" in n for n in accepted)
    assert any("identity astype" in n for n in accepted)
    assert any("view chain back to [mx8]" in n for n in accepted)
    rng = np.random.default_rng(4)
    for n, m in ((1, 3), (5, 2)):
        x, y = rng.standard_normal((n, 8)).astype("float32"), rng.standard_normal((m, 8)).astype("float32")
        got = run_vm(after, x, y)
        want = [x.reshape(n * 2, 4), x.reshape(n * 2, 4).T[None], y, y]
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


@I.ir_module
class ViewChainBack:
    @R.function
    def main(x: R.Tensor((4, 6), "float32")):
        with R.dataflow():
            a = R.reshape(x, (2, 2, 6))
            b = R.permute_dims(a, [0, 2, 1])
            c = R.permute_dims(b, [0, 2, 1])
            d = R.reshape(c, (4, 6))
            e = R.nn.relu(d)
            R.output(e)
        return e


@I.ir_module
class ViewChainsThatMove:
    @R.function
    def main(x: R.Tensor((4, 6), "float32"), y: R.Tensor((2, 2, 6), "float32")):
        with R.dataflow():
            a = R.reshape(x, (2, 2, 6))
            p = R.reshape(R.permute_dims(a, [0, 2, 1]), (4, 6))  # a real transpose: stays
            q = R.reshape(R.add(a, y), (4, 6))  # y is not a scalar: the add does not commute
            r = R.reshape(R.multiply(R.exp(a), R.const(2.0, "float32")), (3, 8))  # a new shape
            s = R.flatten(R.reshape(R.multiply(R.exp(a), R.const(np.full((1,), 3, "float32"))), (4, 6)))
            R.output(p, q, r, s)
        return (p, q, r, s)


def test_view_chain_back_to_its_start_runs_one_kernel():
    """reshape -> permute -> inverse permute -> reshape -> relu is relu(x): one kernel, no
    copy at the output (SinkReshapes leaves reshape(relu(reshape(x))), which cancels too)."""
    compiled = aicf_tvm.compile(ViewChainBack, target={"kind": "llvm", "num-cores": 2})
    assert [k.kind for k in compiled.kernels] == ["relu"]
    x = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    np.testing.assert_array_equal(compiled(x), np.maximum(x, 0))


def test_view_chains_cancel_only_back_to_their_start():
    after, report = eliminate(ViewChainsThatMove)
    notes = [d.note for d in report.accepted if "view chain" in d.note]
    assert len(notes) == 1 and "across exp, multiply" in notes[0]  # only the reshape inside s
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 6)).astype("float32"), rng.standard_normal((2, 2, 6)).astype("float32")
    a = x.reshape(2, 2, 6)
    want = [a.transpose(0, 2, 1).reshape(4, 6), (a + y).reshape(4, 6), (np.exp(a) * 2).reshape(3, 8),
            (np.exp(x) * 3).reshape(24)]
    for got, w in zip(run_vm(after, x, y), want):
        np.testing.assert_allclose(got, w, rtol=1e-6)


@I.ir_module
class DeadEmit:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            unused = R.exp(x)  # noqa: F841 - the dead Emit under test
            y = R.nn.relu(x)
            R.output(y)
        return y


def test_dead_pure_emit_goes():
    after, report = eliminate(DeadEmit)
    assert kinds(after) == ["relu"]
    assert any(d.candidate == "eliminate:dead" for d in report.accepted)


@I.ir_module
class TransposedWeight:
    @R.function
    def main(x: R.Tensor((4, 16), "float32")):
        with R.dataflow():
            w = R.permute_dims(R.const(np.arange(8 * 16, dtype="float32").reshape(8, 16) / 100), [1, 0])
            y = R.matmul(x, w)
            z = R.add(y, R.const(np.ones(8, "float32")))
            R.output(z)
        return z


def test_transposed_weight_is_materialized_at_compile_time():
    """The weight's transpose runs once at compile time: a fused GEMM per inference and
    no transpose kernel."""
    lifted = PropagateContracts()(LiftEmits()(TransposedWeight))
    report = FusionReport()
    after = MaterializeEmits(report=report)(lifted)
    assert "permute_dims" not in kinds(after)
    assert [d.candidate for d in report.accepted] == ["materialize:permute_dims"]
    compiled = aicf_tvm.compile(TransposedWeight, target={"kind": "llvm", "num-cores": 2})
    assert [k.kind for k in compiled.kernels] == ["fused_gemm_bias_act"]
    x = np.random.default_rng(0).standard_normal((4, 16)).astype("float32")
    w = (np.arange(8 * 16, dtype="float32").reshape(8, 16) / 100).T
    np.testing.assert_allclose(compiled(x), x @ w + 1, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mod", [IdentityOps, CastPairs, ReshapeViews])
def test_pipeline_numbers_match_reference(mod):
    compiled = aicf_tvm.compile(mod, target={"kind": "llvm", "num-cores": 2})
    rng = np.random.default_rng(1)
    args = [rng.standard_normal([int(d) for d in p.ty.shape.values]).astype(str(p.ty.dtype))
            for p in mod["main"].params]
    got = compiled(*args)
    got = got if isinstance(got, list) else [got]
    for g, w in zip(got, run_vm(mod, *args)):
        np.testing.assert_array_equal(g, w)


def mask_attention(mask_shape: tuple[int, ...]) -> tvm.IRModule:
    """softmax(q·kᵀ + mask)·v over 2 heads of 8 rows and keys, the mask of ``mask_shape``."""
    params = [relax.Var(n, relax.TensorType((1, 2, 8, 4), "float32")) for n in ("q", "k", "v")]
    params.append(relax.Var("mask", relax.TensorType(mask_shape, "float32")))

    def body(bb, q, k, v, mask):
        s = bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))))
        p = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.add(s, mask)), axis=-1))
        return relax.op.matmul(p, v)

    return relax_main(params, body)


@pytest.mark.parametrize(("mask_shape", "materialized"), [((1, 1, 8, 1), True), ((1, 1, 1, 8), False)],
                         ids=["over the keys", "over the rows"])
def test_broadcast_is_materialized_when_insert_and_fuse_wins(mask_shape, materialized):
    """A mask broadcast over the keys ([1,1,8,1], a bias per query row) fails attention's
    mask requirement [1,1,8,8]; inserting broadcast_to costs 512 B and lets the attention
    fuse (benefit larger): taken. A padding mask [1,1,1,8] (one row for every query) meets
    it as it is: nothing materialized."""
    compiled = aicf_tvm.compile(mask_attention(mask_shape), target={"kind": "llvm", "num-cores": 2})
    kinds_run = [k.kind for k in compiled.kernels]
    assert "fused_attention" in kinds_run
    decisions = [d for d in compiled.report.decisions if d.candidate == "materialize:broadcast_to"]
    if materialized:
        assert any(d.accepted and "fused_attention" in d.note and "mask [1x1x8x1] -> [1x1x8x8]; cost 512 B <" in d.note
                   for d in decisions)
    else:
        assert not decisions
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 8, 4)).astype("float32") for _ in range(3))
    mask = np.where(rng.random(mask_shape) < 0.3, -1e9, 0).astype("float32")
    s = q @ k.transpose(0, 1, 3, 2) + mask
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(compiled(q, k, v, mask), (e / e.sum(-1, keepdims=True)) @ v, rtol=1e-5, atol=1e-5)


@I.ir_module
class BroadcastResidualNorm:
    @R.function
    def main(x: R.Tensor((4, 64, 32), "float32"), r: R.Tensor((1, 1, 32), "float32"),
             g: R.Tensor((32,), "float32"), b: R.Tensor((32,), "float32")):
        with R.dataflow():
            h = R.add(x, r)
            y = R.nn.layer_norm(h, g, b, axes=[-1])
            R.output(y)
        return y


def test_broadcast_is_not_materialized_when_it_costs_more():
    """A [1,1,32] addend into a norm: broadcasting it to [4,64,32] would write and read
    64 KiB to save one 32 KiB intermediate: refused, with both numbers."""
    from relax_passes.materialize_emits import broadcasts_to

    assert broadcasts_to((1, 1, 1, 8), (1, 1, 8, 8)) and not broadcasts_to((1, 2, 1, 8), (1, 1, 8, 8))
    compiled = aicf_tvm.compile(BroadcastResidualNorm, target={"kind": "llvm", "num-cores": 2})
    [decision] = [d for d in compiled.report.decisions if d.candidate == "materialize:broadcast_to"]
    assert not decision.accepted
    assert "residual [1x1x32] -> [4x64x32]; cost 65536 B >= benefit" in decision.note
    rng = np.random.default_rng(0)
    x, r = rng.standard_normal((4, 64, 32)).astype("float32"), rng.standard_normal((1, 1, 32)).astype("float32")
    g, b = rng.standard_normal(32).astype("float32"), rng.standard_normal(32).astype("float32")
    h = x + r
    want = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5) * g + b
    np.testing.assert_allclose(compiled(x, r, g, b), want, rtol=1e-4, atol=1e-4)
