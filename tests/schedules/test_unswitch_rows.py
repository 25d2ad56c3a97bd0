"""The attention's row sums run without the row tail's predicate where a tile is whole
(``schedules.cpu.unswitch_rows``): the same bits as the kernel that keeps it, at whole and
partial last tiles, with NaN and masked rows, and the copy really lacks the predicate."""

from __future__ import annotations

import numpy as np
import pytest
import tvm_ffi
from tvm import ir, s_tir, tirx

import aicf_tvm

from ..conftest import llvm_target
from .test_cpu_attention import causal_mask, operands, sdpa
from .test_masked_keys import _attention_kernel

HEADS, DIM = 4, 32


@pytest.fixture(scope="module")
def kernels():
    seq = tirx.Var("seq", "int64")
    mod = sdpa(seq, HEADS, DIM, 2)
    return {flag: aicf_tvm.compile(mod, target=llvm_target(),
                                   options=aicf_tvm.CompileOptions(attention_unswitch_rows=flag))
            for flag in (True, False)}


def _is_add(value: tirx.Expr) -> bool:
    """``a + b``, also as the IEEE pass writes it after scheduling (``aicf.ieee_add``)."""
    return isinstance(value, tirx.Add) or (isinstance(value, ir.Call) and "ieee_add" in str(value.op.name))


def _row_sum_realizes(func: tirx.PrimFunc) -> list[s_tir.SBlockRealize]:
    """The realizes of the float sum blocks (an init, ``acc + x``; not the matmuls) of ``func``."""
    found: list[s_tir.SBlockRealize] = []

    def visit(realize: s_tir.SBlockRealize) -> None:
        b = realize.block
        if b.init is not None and isinstance(b.body, tirx.BufferStore) and _is_add(b.body.value) \
                and str(b.body.buffer.ty.dtype).startswith("float") and "matmul" not in b.name_hint:
            found.append(realize)

    tvm_ffi.structural_walk(func.body, [(s_tir.SBlockRealize, visit)])
    return found


def test_the_row_sums_have_a_copy_without_the_row_predicate(kernels):
    with_copy = _row_sum_realizes(_attention_kernel(kernels[True]))
    plain = _row_sum_realizes(_attention_kernel(kernels[False]))
    assert len(plain) == 1 and not (isinstance(plain[0].predicate, tirx.IntImm) and plain[0].predicate.value)
    assert len(with_copy) == 2
    assert sum(isinstance(r.predicate, tirx.IntImm) and bool(r.predicate.value) for r in with_copy) == 1


@pytest.mark.parametrize("seq", [8, 37, 64, 131])
def test_whole_and_partial_tiles_give_the_same_bits(kernels, rand, seq):
    q, k, v = operands(rand, seq, HEADS, DIM, 2)
    mask = causal_mask(seq, masked_row=seq // 2)
    q[0, seq - 1, 3] = np.nan
    got, want = (np.asarray(kernels[flag](q, k, v, mask)) for flag in (True, False))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.where(np.isnan(got), 0, got).view(np.uint32),
                                  np.where(np.isnan(want), 0, want).view(np.uint32))
