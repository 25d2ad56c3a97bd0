"""Kernels with symbolic extents in tuning (schedules/tune_symbolic.py): the bindings they
are timed at, and the GEMM rule's choices that serve every binding.  No tuning run here
(tests/aicf_tvm/driver/tuning/test_symbolic.py has them)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, tirx

from aicf_tvm.driver.symbolic import with_dim_bounds
from aicf_tvm.driver.tuning.run import lower_for_tuning
from aicf_tvm.runtime.targets import resolve_target
from relax_passes.bound_shapes import bounds_of
from schedules.cpu import Gemm
from schedules.select import workload_of
from schedules.tuning.symbolic import DEFAULT_UPPER, kernel_bindings, representative_values
from tests.helpers import relax_main


@pytest.mark.parametrize(("low", "high", "values"), [
    (1, 512, [1, 23, 512]),  # the bounds and their geometric middle
    (None, 256, [1, 16, 256]),  # no lower bound: 1
    (4, None, [4, 45, DEFAULT_UPPER]),  # no upper bound: DEFAULT_UPPER
    (None, None, [1, 23, DEFAULT_UPPER]),
    (8, 8, [8]),  # a dim bound to one value
])
def test_representative_values(low, high, values):
    assert representative_values(low, high) == values


def _linear(rng: np.random.Generator, rows: tuple[tirx.Var, ...], k: int = 16, n: int = 8) -> tvm.IRModule:
    """relu(reshape(x, [prod(rows), k]) @ w) for x of shape [*rows, k]."""
    x = relax.Var("x", relax.TensorType([*rows, k], "float32"))
    w = relax.const(rng.standard_normal((k, n)).astype("float32"))

    def body(bb, x):
        flat = bb.emit(relax.op.reshape(x, [tvm.tirx.const(1, "int64") * rows[0] * rows[-1], k])) \
            if len(rows) > 1 else x
        return relax.op.nn.relu(bb.emit(relax.op.matmul(flat, w)))

    return relax_main([x], body)


def test_kernel_extents_follow_their_call_site():
    """The model's dims move together (the i-th binding gives each its i-th value) and a
    kernel's rows ``batch * seq`` are evaluated from its call site."""
    batch, seq = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    mod = with_dim_bounds(_linear(np.random.default_rng(3), (batch, seq)), {"batch": (1, 4), "seq": (1, 64)})
    lowered = lower_for_tuning(mod, resolve_target("llvm"))
    found = kernel_bindings(lowered, bounds_of(lowered["main"]))
    assert found, "no kernel with symbolic extents"
    for name, bindings in found.items():
        func = lowered[name]
        (var,) = {v.name for p in func.params for d in p.ty.shape for v in tirx.analysis.undefined_vars(d)}
        assert [b[var] for b in bindings] == [1 * 1, 2 * 8, 4 * 64]


def _symbolic_gemm(rng: np.random.Generator) -> tuple[tirx.PrimFunc, tvm.target.Target]:
    rows = tirx.Var("rows", "int64")
    mod = with_dim_bounds(_linear(rng, (rows,), k=64, n=48), {"rows": (1, 256)})
    target = resolve_target("llvm")
    lowered = lower_for_tuning(mod, target)
    (func,) = [f for _, f in lowered.functions_items() if isinstance(f, tirx.PrimFunc)]
    return workload_of(func, target)["main"], target


def test_every_gemm_choice_schedules_the_symbolic_kernel_and_only_those_apply():
    """``choices`` are complete schedules of the symbolic kernel, the default plan's first
    (the rule's own schedule); ``apply_choice`` rebuilds exactly the one named, and a
    choice that is no candidate of this kernel gets None (compile keeps the default)."""
    func, target = _symbolic_gemm(np.random.default_rng(4))
    choices = Gemm().choices(func, target)
    assert len(choices) > 2
    assert tvm_ffi.structural_equal(choices[0][1].mod, Gemm().apply(func, target, False).mod)
    assert len({tvm_ffi.structural_hash(s.mod) for _, s in choices}) == len(choices)
    choice, sch = choices[2]
    assert tvm_ffi.structural_equal(Gemm().apply_choice(func, target, choice).mod, sch.mod)
    assert Gemm().apply_choice(func, target, {**choice, "mr": 999}) is None
    assert Gemm().apply_choice(func, target, {"tile": 4}) is None
