"""The pipeline's rewrite fixpoint: verify_contracts after every step, bounded, stable."""

from __future__ import annotations

import tvm_ffi

from aicf_tvm import verify_contracts
from aicf_tvm.models import BUILTIN_MODELS
from aicf_tvm.pipeline import MAX_ROUNDS, normalize, optimize
from aicf_tvm.report import FusionReport
from aicf_tvm.targets import describe, resolve_target


def test_verify_runs_after_every_step_and_the_fixpoint_is_bounded():
    checked = []

    def check(mod):
        verify_contracts(mod)
        checked.append(mod)

    out = optimize(normalize(BUILTIN_MODELS["decoder_block_small"]()), FusionReport(), check=check)
    # lift+propagate, then per round Eliminate, Materialize, Fuse (each re-propagated)
    assert 1 + 3 <= len(checked) <= 1 + 3 * MAX_ROUNDS
    again = optimize(out, FusionReport(), check=verify_contracts)
    assert tvm_ffi.structural_equal(again, out)  # a fixpoint: nothing left to rewrite


def test_llvm_means_this_cpu():
    text = describe(resolve_target("llvm"))
    assert "mcpu=" in text and "num-cores=" in text
