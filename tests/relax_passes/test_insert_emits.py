"""InsertEmits: the Emit a refused candidate needs, inserted when insert-and-fuse wins."""

from __future__ import annotations

import numpy as np
import tvm

from aicf_tvm.core.report import FusionReport
from aicf_tvm.driver.pipeline import normalize
from relax_passes import InsertEmits, LiftEmits, MaterializeEmits, PropagateContracts
from relax_passes.insert_emits import broadcasts_to

from ..conftest import run_vm
from .test_materialize_emits import WITH_PACKED_GEMM, transposed_operand


def lifted(mod: tvm.IRModule) -> tvm.IRModule:
    return PropagateContracts()(LiftEmits()(normalize(mod)))


def test_a_contiguous_copy_is_inserted_for_a_transposed_gemm_operand():
    """packed_gemm requires a row-major A; A is a transposed view [32, 8]: a copy costs
    2 x 1 KiB, less than the fusion saves, so it is inserted before the GEMM."""
    before = lifted(transposed_operand(32))
    report = FusionReport()
    after = InsertEmits(report=report, candidates=WITH_PACKED_GEMM)(before)
    [decision] = [d for d in report.decisions if d.candidate == "materialize:contiguous"]
    assert decision.accepted and "contiguous copy" in decision.note
    names = [b.var.name for b in after["main"].body.blocks[0].bindings]
    assert any(n.endswith("_contig") for n in names)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype("float32") for s in ((32, 8), (32, 16), (16,))]
    np.testing.assert_allclose(run_vm(after, *args)[0], run_vm(before, *args)[0], rtol=1e-5)


def test_materialize_emits_inserts_the_same_way():
    before = lifted(transposed_operand(32))
    tvm.ir.assert_structural_equal(MaterializeEmits(candidates=WITH_PACKED_GEMM)(before),
                                   InsertEmits(candidates=WITH_PACKED_GEMM)(before))


def test_nothing_is_inserted_where_the_copy_costs_more():
    before = lifted(transposed_operand(512))
    report = FusionReport()
    assert InsertEmits(report=report, candidates=WITH_PACKED_GEMM)(before).same_as(before)
    assert [d.accepted for d in report.decisions if d.candidate == "materialize:contiguous"] == [False]


def test_broadcasts_to_follows_numpy():
    assert broadcasts_to((1, 1, 1, 8), (1, 1, 8, 8)) and broadcasts_to((8,), (4, 8))
    assert not broadcasts_to((2, 8), (4, 8)) and not broadcasts_to((4, 8), (8,))
