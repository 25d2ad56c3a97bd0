"""PrecomputeBoundedTables: float tables of bounded ``arange`` positions folded at the bound
and sliced per call (``relax_passes.bounded_tables``).

The numeric cases compare the rewritten module, built with TVM's default pipeline, with
numpy's rotary table at several lengths, 1 and the bound included; the structural cases
check which values are tables (float, computed, bounded) and which stay.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from relax_passes.bounded_tables import PrecomputeBoundedTables

from ..conftest import run_vm

BOUND = 64


def _rotary(bounded: bool = True, end_offset: int = 0) -> tvm.IRModule:
    """``x * cos(concat(p * f, p * f))`` for positions ``p = arange(0, s + end_offset)``,
    as LLaMA's rotary embedding exports; ``s <= 64`` when ``bounded``."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType((s + end_offset, 8), "float32"))
    freq = relax.const(np.linspace(0.05, 1.0, 4, dtype="float32").reshape(1, 4))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            pos = bb.emit(relax.op.arange(0, s + end_offset if end_offset else s, 1, "int64"))
            pos = bb.emit(relax.op.add(pos, relax.const(0, "int64")))
            pos = bb.emit(relax.op.astype(bb.emit(relax.op.expand_dims(pos, [1])), "float32"))
            angle = bb.emit(relax.op.multiply(pos, bb.emit(relax.op.astype(freq, "float32"))))
            table = bb.emit(relax.op.cos(bb.emit(relax.op.concat([angle, angle], axis=-1))))
            out = bb.emit_output(relax.op.multiply(x, bb.emit(relax.op.astype(table, "float32"))))
        bb.emit_func_output(out)
    mod = bb.get()
    if bounded:
        mod["main"] = mod["main"].with_attr("tir_var_upper_bound", {"s": BOUND})
    return mod


def _ops(mod: tvm.IRModule) -> set[str]:
    found: set[str] = set()
    relax.analysis.post_order_visit(
        mod["main"],
        lambda e: found.add(e.op.name) if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None)
    return found


def _apply(mod: tvm.IRModule) -> tvm.IRModule:
    return relax.transform.DeadCodeElimination()(PrecomputeBoundedTables()(mod))


def test_rotary_table_is_folded_to_a_slice():
    ops = _ops(_apply(_rotary()))
    assert "relax.strided_slice" in ops
    assert not ops & {"relax.cos", "relax.arange", "relax.concat"}


@pytest.mark.parametrize("rows", [1, 7, 16, BOUND])
def test_sliced_table_matches_numpy(rows):
    """The table sliced to ``rows`` holds cos(i * f) for i < rows, as computed per call."""
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 8)).astype("float32")
    angle = np.arange(rows, dtype="float32")[:, None] * np.linspace(0.05, 1.0, 4, dtype="float32")[None, :]
    expected = x * np.cos(np.concatenate([angle, angle], axis=-1))
    np.testing.assert_allclose(run_vm(_apply(_rotary()), x)[0], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run_vm(_rotary(), x)[0], expected, rtol=1e-5, atol=1e-6)


def test_without_a_bound_nothing_changes():
    before = _rotary(bounded=False)
    tvm.ir.assert_structural_equal(PrecomputeBoundedTables()(before), before)


def test_positions_past_a_plain_dim_are_no_table():
    """``arange(0, s + 1)``: its length is no bounded dim, so no table."""
    before = _rotary(end_offset=1)
    tvm.ir.assert_structural_equal(PrecomputeBoundedTables()(before), before)


def test_integer_index_tables_stay():
    """``arange(s) + 0`` expanded is an index tensor: cheap, fusible, and NormalizeIndices
    proves its range from the arange; it is not folded."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType((s, 1), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            pos = bb.emit(relax.op.add(relax.op.arange(0, s, 1, "int64"), relax.const(0, "int64")))
            out = bb.emit_output(relax.op.add(x, relax.op.expand_dims(pos, [1])))
        bb.emit_func_output(out)
    before = bb.get()
    before["main"] = before["main"].with_attr("tir_var_upper_bound", {"s": BOUND})
    tvm.ir.assert_structural_equal(PrecomputeBoundedTables()(before), before)
