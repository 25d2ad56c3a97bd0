"""LiftEmits: every op call of main's dataflow block becomes an Emit function call."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from aicf_tvm import emit_of, verify_contracts
from aicf_tvm.core.lattice import Effect
from relax_passes import LiftEmits

from ..conftest import run_vm
from .helpers import strip_emits


@I.ir_module
class Before:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 16), "float32"), b: R.Tensor((16,), "float32")):
        with R.dataflow():
            y = R.matmul(x, w)
            z = R.add(y, b)
            r = R.nn.relu(z)
            s = R.nn.relu(r)
            R.output(s)
        return s


@I.ir_module
class Expected:
    @R.function(private=True)
    def emit_matmul(x1: R.Tensor((4, 8), "float32"), x2: R.Tensor((8, 16), "float32")) -> R.Tensor((4, 16), "float32"):
        R.func_attr({"Primitive": True})
        with R.dataflow():
            gv = R.matmul(x1, x2)
            R.output(gv)
        return gv

    @R.function(private=True)
    def emit_add(x1: R.Tensor((4, 16), "float32"), x2: R.Tensor((16,), "float32")) -> R.Tensor((4, 16), "float32"):
        R.func_attr({"Primitive": True})
        with R.dataflow():
            gv = R.add(x1, x2)
            R.output(gv)
        return gv

    @R.function(private=True)
    def emit_relu(x: R.Tensor((4, 16), "float32")) -> R.Tensor((4, 16), "float32"):
        R.func_attr({"Primitive": True})
        with R.dataflow():
            gv = R.nn.relu(x)
            R.output(gv)
        return gv

    @R.function
    def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 16), "float32"), b: R.Tensor((16,), "float32")):
        cls = Expected
        with R.dataflow():
            y = cls.emit_matmul(x, w)
            z = cls.emit_add(y, b)
            r = cls.emit_relu(z)
            s = cls.emit_relu(r)
            R.output(s)
        return s


class TestLiftsChainAndSharesIdenticalEmits:
    """Three kinds, four calls: the two relus are one Emit and share one function."""

    def test_structure(self):
        after = LiftEmits()(Before)
        tvm.ir.assert_structural_equal(strip_emits(after), Expected)

    def test_annotations(self):
        after = LiftEmits()(Before)
        verify_contracts(after)
        relu = emit_of(after["emit_relu"])
        assert relu.kind == "relu" and relu.op == "relax.nn.relu"
        assert relu.contract.provides.port("x").effect == Effect("Read")
        assert relu.contract.provides.port("out").effect == Effect("Write")
        assert emit_of(after["emit_matmul"]).interface.port_names() == ["x1", "x2", "out"]

    def test_idempotent(self):
        once = LiftEmits()(Before)
        tvm.ir.assert_structural_equal(LiftEmits()(once), once)

    def test_same_numbers(self):
        rng = np.random.default_rng(0)
        args = [rng.standard_normal(s).astype("float32") for s in ((4, 8), (8, 16), (16,))]
        np.testing.assert_allclose(run_vm(LiftEmits()(Before), *args)[0], run_vm(Before, *args)[0], rtol=1e-6)


@I.ir_module
class WithTupleAndSymbolic:
    @R.function
    def main(x: R.Tensor(("n", 8), "float32")):
        n = T.int64()
        with R.dataflow():
            parts = R.split(x, 2, axis=1)
            a = parts[0]
            b = parts[1]
            c = R.concat((a, b), axis=0)
            d = R.reshape(x, R.shape([n * 8]))
            e = R.reshape(c, R.shape([n * 8]))  # n is not definable from c's (n*2, 4): a tir_vars arg
            R.output(d, e)
        return (d, e)


class TestTuplesAndSymbolicShapes:
    """split's tuple result, concat's tuple argument and a symbolic reshape all lift;
    tuple reads stay structural bindings. The reshape of ``c`` names ``n``, which ``c``'s
    type does not define: its Emit takes ``n`` as a last ``tir_vars`` shape parameter."""

    def test_lifts(self):
        after = LiftEmits()(WithTupleAndSymbolic)
        verify_contracts(after)
        kinds = sorted(emit_of(f).kind for gv, f in after.functions_items() if gv.name_hint != "main")
        assert kinds == ["concat", "reshape", "reshape", "split"]
        concat = emit_of(after["emit_concat"])
        assert concat.interface.port_names() == ["tensors.0", "tensors.1", "out"]
        split = emit_of(after["emit_split"])
        assert [p.name for p in split.interface.outputs] == ["out.0", "out.1"]
        e = after["main"].body.blocks[0].bindings[-1].value
        assert emit_of(after[e.op.name_hint]).kind == "reshape"
        assert isinstance(e.args[-1], relax.ShapeExpr) and [str(v) for v in e.args[-1].values] == ["n"]
        assert after[e.op.name_hint].params[-1].name == "tir_vars"

    def test_same_numbers(self):
        x = np.random.default_rng(0).standard_normal((3, 8)).astype("float32")
        for got, want in zip(run_vm(LiftEmits()(WithTupleAndSymbolic), x), run_vm(WithTupleAndSymbolic, x)):
            np.testing.assert_array_equal(got, want)


@I.ir_module
class CompoundExtents:
    @R.function
    def main(x: R.Tensor(("b", "s", 8), "float32"), w: R.Tensor((8, 4), "float32")):
        b, s = T.int64(), T.int64()
        with R.dataflow():
            rows = R.reshape(x, R.shape([b * s, 8]))
            y = R.matmul(rows, w)  # rows of b * s: defined by no plain extent
            shape = R.shape_of(y)
            t = R.shape_to_tensor(shape)  # the caller's shape value: stays a plain call
            R.output(y, t)
        return (y, t)


def test_compound_extents_become_the_emits_own_vars():
    """The matmul over ``b * s`` rows lifts with a parameter ``(d0, 8)`` of its own, bound
    at the call (``d0 = b * s``: the caller's result type is unchanged); ``shape_to_tensor``
    of the caller's shape value would be a free var of an Emit function and stays a call."""
    after = LiftEmits()(CompoundExtents)
    verify_contracts(after)
    matmul = after["emit_matmul"]
    d0, k = matmul.params[0].ty.shape.values
    assert isinstance(d0, tvm.tirx.Var) and d0.name == "d0" and int(k) == 8
    y, t = (b for b in after["main"].body.blocks[0].bindings if b.var.name in ("y", "t"))
    assert isinstance(y.value.op, relax.GlobalVar) and str(y.var.ty.shape) == "R.shape([b * s, 4])"
    assert t.value.op.name == "relax.shape_to_tensor"
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 3, 8)).astype("float32"), rng.standard_normal((8, 4)).astype("float32")
    for got, want in zip(run_vm(after, x, w), run_vm(CompoundExtents, x, w)):
        np.testing.assert_array_equal(got, want)


@I.ir_module
class NothingToLift:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        return x


def test_no_change_without_op_calls():
    tvm.ir.assert_structural_equal(LiftEmits()(NothingToLift), NothingToLift)
