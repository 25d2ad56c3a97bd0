"""ImplicitBroadcasts: an explicit broadcast goes only where the consumer broadcasts the same."""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import aicf_tvm
from relax_passes.implicit_broadcasts import ImplicitBroadcasts

from ..conftest import run_vm
from .helpers import op_names


@I.ir_module
class Broadcasts:
    @R.function
    def main(x: R.Tensor(("b", "s", 8), "float32"), w: R.Tensor((8, 4), "float32"),
             p: R.Tensor(("b", 2, "s", "s"), "float32"), c: R.Tensor(("b", 2, "s", 1), "bool"),
             v: R.Tensor((1, 4), "float32")):
        b, s = T.int64(), T.int64()
        with R.dataflow():
            wb = R.broadcast_to(w, R.shape([b, 8, 4]))
            y = R.matmul(x, wb)  # the batch axis broadcasts by itself: wb goes
            z = R.full_like(p, R.const(0.0, "float32"))
            q = R.where(c, z, p)  # p has the full shape: the zeros are a scalar
            vb = R.broadcast_to(v, R.shape([8, 4]))
            u = R.matmul(x, vb)  # broadcasting v's rows is not matmul's: stays
            r = R.add(R.broadcast_to(R.const(np.ones((1, 4), "float32")), R.shape([b, s, 4])),
                      R.const(1.0, "float32"))  # the add's result would shrink: stays
            R.output(y, q, u, r)
        return (y, q, u, r)


def test_broadcasts_the_consumer_makes_go_and_the_rest_stay():
    after = ImplicitBroadcasts()(Broadcasts)
    assert op_names(after).count("relax.broadcast_to") == 2 and "relax.full_like" not in op_names(after)
    assert tvm_ffi.structural_equal(ImplicitBroadcasts()(after), after)  # idempotent
    rng = np.random.default_rng(21)
    for b, s in ((1, 3), (2, 5)):
        args = [rng.standard_normal((b, s, 8)).astype("float32"), rng.standard_normal((8, 4)).astype("float32"),
                rng.standard_normal((b, 2, s, s)).astype("float32"), rng.standard_normal((b, 2, s, 1)) > 0,
                rng.standard_normal((1, 4)).astype("float32")]
        for got, want in zip(run_vm(after, *args), run_vm(Broadcasts, *args)):
            np.testing.assert_array_equal(got, want)


_MIXED_ZEROS = np.zeros((2, 3, 5, 5), "float32")
_MIXED_ZEROS[1, 2, 3, 4] = -0.0  # the same value, other bits: x + (-0.0) keeps a -0.0 that x + 0.0 does not
_NANS = np.full((3, 5), np.nan, "float32")
_NANS.view("uint32")[0, 0] |= 1  # another NaN payload


@I.ir_module
class Uniform:
    @R.function
    def main(s: R.Tensor((2, 3, 5, 5), "float32"), x: R.Tensor((3, 5), "float32"), v: R.Tensor((5,), "float32")):
        with R.dataflow():
            pos = R.arange(0, 5, 1, dtype="int64")  # SDPA's mask as torch.export leaves it: all kept
            keep = R.greater_equal(R.expand_dims(pos, axis=[0, 1, 3]), R.const(0, "int64"))
            mask = R.where(R.broadcast_to(keep, R.shape([1, 1, 5, 5])), R.const(0.0, "float32"),
                           R.const(float("-inf"), "float32"))
            masked = R.add(s, mask)  # a chain of ops on constants, all +0.0: a scalar
            filled = R.where(R.less(s, R.const(0.0, "float32")),
                             R.const(np.zeros((2, 3, 5, 5), "float32")), s)  # a scalar
            mixed = R.add(s, R.const(_MIXED_ZEROS))  # -0.0 among +0.0: stays
            nans = R.multiply(x, R.const(_NANS))  # two NaN payloads: stays
            bias = R.add(x, R.const(np.zeros((5,), "float32")))  # per channel: stays
            ones = R.add(v, R.const(np.ones((3, 5), "float32")))  # its shape makes the output's: stays
            R.output(masked, filled, mixed, nans, bias, ones)
        return (masked, filled, mixed, nans, bias, ones)


def _tensor_constants(mod) -> list:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(tuple(e.value.shape))
                                    if isinstance(e, tvm.ir.Constant) and isinstance(e.ty, relax.TensorType)
                                    and e.ty.ndim > 0 else None)
    return found


def test_a_uniform_constant_operand_becomes_its_one_element():
    after = ImplicitBroadcasts()(Uniform)
    assert "relax.arange" not in op_names(after)  # the mask chain went with its last use
    assert sorted(_tensor_constants(after)) == [(2, 3, 5, 5), (3, 5), (3, 5), (5,)]
    s = np.random.default_rng(22).standard_normal((2, 3, 5, 5)).astype("float32")
    s.reshape(-1)[:6] = [-0.0, 0.0, np.inf, -np.inf, np.nan, -0.0]
    s[1, 2, 3, 4] = -0.0
    x = np.random.default_rng(23).standard_normal((3, 5)).astype("float32")
    v = np.array([-0.0, 1.5, -2.0, np.inf, np.nan], "float32")
    # TVM's default build of the rewritten module would not do: its TIR simplifier folds an
    # immediate ``x + 0.0`` into ``x``, which keeps a -0.0. Ours keeps such a zero a buffer
    # (``lower_emits.bind_scalar_ports``), and must give the original's bits.
    ours = aicf_tvm.compile(after, target="llvm")(s, x, v)
    for got, want in zip(ours, run_vm(Uniform, s, x, v)):
        np.testing.assert_array_equal(np.asarray(got).view("uint32"), want.view("uint32"))


def test_uniform_constants_stay_whole_when_the_options_say_so():
    """``CompileOptions.uniform_constants_as_scalars=False`` (the rule before, which the A/B
    script measures against): the mask chain and its uniform operands stay as they are."""
    after = ImplicitBroadcasts(aicf_tvm.CompileOptions(uniform_constants_as_scalars=False))(Uniform)
    assert "relax.arange" in op_names(after)
    assert sorted(_tensor_constants(after)) == [(2, 3, 5, 5), (2, 3, 5, 5), (3, 5), (3, 5), (5,)]


def test_a_deep_model_is_walked_once():
    """1200 adds in a row, every other one of a uniform constant: the pass finds the
    constant-only chains in one pass over the bindings (a walk from each add back to the
    input exceeded Python's recursion limit), and the uniform operands become scalars."""
    x = relax.Var("x", relax.TensorType((8, 8), "float32"))
    rng = np.random.default_rng(24)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for i in range(1200):
                c = np.full((8, 8), i, "float32") if i % 2 else rng.standard_normal((8, 8)).astype("float32")
                y = bb.emit(relax.op.add(y, relax.const(c)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    after = ImplicitBroadcasts()(bb.get())
    assert len(_tensor_constants(after)) == 600


def test_the_chains_evaluated_at_once_give_what_each_alone_gives(monkeypatch):
    """``prepare`` evaluates every chain in one fold (``evaluate_static``); with that batch
    made to fail, each chain is evaluated on its own as before: the same module."""
    import relax_passes.implicit_broadcasts as ib

    asked = []
    evaluate = ib.evaluate_static
    monkeypatch.setattr(ib, "evaluate_static", lambda b, wanted: asked.append(wanted) or evaluate(b, wanted))
    batched = ImplicitBroadcasts()(Uniform)
    assert len(asked) == 1 and len(asked[0]) >= 1  # the mask chain went through the batch

    def refuse(*args):
        raise RuntimeError("no batch")

    monkeypatch.setattr(ib, "evaluate_static", refuse)
    assert tvm_ffi.structural_equal(ImplicitBroadcasts()(Uniform), batched)
    assert "relax.arange" not in op_names(batched)
