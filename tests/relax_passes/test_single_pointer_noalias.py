"""SinglePointerNoAlias: the VM's shape function no longer strips noalias from the kernels."""

from __future__ import annotations

import re

import numpy as np
from tvm import relax, tirx
from tvm.script import tirx as T

import aicf_tvm
from relax_passes.single_pointer_noalias import SinglePointerNoAlias, pointer_params

from ..helpers import relax_main

TARGET = {"kind": "llvm", "num-cores": 2}


@T.prim_func(private=True)
def one_pointer(h: T.handle):
    H = T.match_buffer(h, (4,), "int64")
    H[0] = H[1] * T.int64(2)


@T.prim_func(private=True)
def two_pointers(a: T.handle, b: T.handle):
    A = T.match_buffer(a, (4,), "float32")
    B = T.match_buffer(b, (4,), "float32")
    B[0] = A[0]


def test_only_functions_with_one_pointer_are_marked():
    import tvm

    mod = SinglePointerNoAlias(tvm.IRModule({"one": one_pointer, "two": two_pointers}))
    assert (pointer_params(one_pointer), pointer_params(two_pointers)) == (1, 2)
    assert mod["one"].attrs["tirx.noalias"]
    assert "tirx.noalias" not in (mod["two"].attrs or {})


def test_kernels_of_a_dynamic_model_keep_noalias():
    """A model with a symbolic dim gets Relax's ``shape_func`` (no ``tirx.noalias``), after
    which TVM's codegen dropped ``noalias`` from every kernel of the module (the GEMM then
    stored its C tile and reloaded A on every step of K)."""
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType([n, 64], "float32"))
    w = relax.const(np.random.default_rng(0).standard_normal((64, 96)).astype("float32"))
    compiled = aicf_tvm.compile(relax_main([x], lambda bb, x: relax.op.matmul(x, w)), target=TARGET)
    source = "".join(m.inspect_source("ll") for m in [compiled.executable.mod, *compiled.executable.mod.imports]
                     if m.kind == "llvm")
    kernels = [line for line in source.splitlines() if re.match(r"define .*matmul\w*_compute_\(", line)]
    assert kernels and all("noalias" in line for line in kernels)
    rng = np.random.default_rng(1)
    for rows in (1, 37):
        a = rng.standard_normal((rows, 64)).astype("float32")
        np.testing.assert_allclose(compiled(a), a @ w.value.numpy(), rtol=1e-4, atol=1e-4)
