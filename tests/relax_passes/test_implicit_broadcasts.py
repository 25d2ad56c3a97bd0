"""ImplicitBroadcasts: an explicit broadcast goes only where the consumer broadcasts the same."""

from __future__ import annotations

import numpy as np
import tvm_ffi
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

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
            r = R.add(R.broadcast_to(R.const(np.ones((1, 4), "float32")), R.shape([b, s, 4])), R.const(1.0, "float32"))  # the add's result would shrink: stays
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
