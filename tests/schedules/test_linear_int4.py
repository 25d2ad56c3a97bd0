"""``schedules.cpu.linear_int4``: the int4 linear kernels against numpy in float64, on
distinct random weights, scales and inputs: the one-row GEMV in its portable form
(shifts and conversions: what an AVX2 CPU runs, and it runs here too) and its AVX-512
lookup form, and the many-row kernel for row counts around its row block; float16 and
float32 scales. ``for_target`` picks the form from the target's features."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.target import Target

from aicf_tvm.runtime.targets import resolve_target
from schedules.cpu.linear_int4 import (
    GROUP,
    INT4_GEMV_ATTR,
    INT4_LINEAR_ATTR,
    ROW_BLOCK,
    fits_int4,
    for_target,
    gemv_int4,
    has_lut,
    int4_form,
    linear_int4,
    pack_int4,
    scale_dtype,
)

HOST = resolve_target("llvm")
AVX2 = Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3"})
AVX512 = Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512"})


def _weight(n: int, k: int, scale: str, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    v = rng.integers(-8, 8, (n, k))
    s = rng.uniform(0.01, 0.2, (n, k // GROUP)).astype(scale)
    return v, s, v * np.repeat(s.astype(np.float64), GROUP, axis=1)  # float64 [N, K]


def _run(kernel, x: np.ndarray, packed: np.ndarray, scales: np.ndarray, n: int) -> np.ndarray:
    lib = tvm.compile(tvm.IRModule({"main": kernel}), target=HOST)
    out = tvm.runtime.empty((*x.shape[:-1], n), "float32", tvm.cpu())
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(packed), tvm.runtime.tensor(scales), out)
    return out.numpy()


@pytest.mark.parametrize("scale", ["float16", "float32"])
@pytest.mark.parametrize(("n", "k"), [(64, 32), (192, 96), (128, 256)])
@pytest.mark.parametrize(("lut", "lanes", "passes"), [(False, 16, 4), (True, 16, 4), (False, 8, 4), (False, 8, 1),
                                                      (False, 4, 16)])
def test_the_gemv_equals_float64(n, k, scale, lut, lanes, passes):
    """Every form: AVX-512's lookup, the portable one in AVX-512's, AVX2's and SSE's
    vectors, in one pass or several."""
    if lut and not has_lut(HOST):
        pytest.skip("the lookup form needs AVX-512")
    v, s, w = _weight(n, k, scale, n + k)
    x = np.random.default_rng(k).standard_normal((1, 1, k)).astype(np.float32)
    got = _run(gemv_int4(n, k, "g", scale, lut, (1, 1), lanes, passes), x, *pack_int4(v, s), n)
    want = x.astype(np.float64) @ w.T
    assert got.shape == (1, 1, n)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("rows", [1, 7, ROW_BLOCK, ROW_BLOCK + 1, 2 * ROW_BLOCK + 3])
@pytest.mark.parametrize("scale", ["float16", "float32"])
@pytest.mark.parametrize("tile", [(4, 64, ROW_BLOCK), (1, 64, ROW_BLOCK), (3, 16, 63)])
def test_the_many_row_kernel_equals_float64(rows, scale, tile):
    """AVX-512's register tile (4 rows x 64 columns), AVX2's (1 x 64) and one whose row
    block (63) is no power of two, for row counts around the block."""
    n, k = 128, 96
    v, s, w = _weight(n, k, scale, rows)
    x = np.random.default_rng(rows).standard_normal((rows, k)).astype(np.float32)
    got = _run(linear_int4(n, k, "l", scale, *tile), x, *pack_int4(v, s), n)
    want = x.astype(np.float64) @ w.T
    assert not np.allclose(got[0], got[-1]) or rows == 1  # every row its own
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_for_target_gives_avx512_the_lookup_form_and_others_the_portable_one():
    mod = tvm.IRModule({"g": gemv_int4(128, 64, "g", "float16", lut=False)})
    assert "permvar" not in for_target(mod, AVX2)["g"].script()
    on_avx512 = for_target(mod, AVX512)["g"]
    assert "llvm.x86.avx512.permvar.sf.512" in on_avx512.script()
    assert str(on_avx512.attrs["global_symbol"]) == "g"
    assert "permvar" not in for_target(tvm.IRModule({"g": on_avx512}), AVX2)["g"].script()


def test_for_target_blocks_registers_by_the_targets_vectors():
    """AVX2 (8 lanes, 16 registers): the GEMV in 8-lane vectors, passes of 4, the
    many-row kernel 1 row x 64 columns; AVX-512 keeps the importer's 4 x 64 kernel as is."""
    mod = tvm.IRModule({"g": gemv_int4(128, 64, "g", "float16"), "l": linear_int4(128, 64, "l", "float16")})
    on_avx2 = for_target(mod, AVX2)
    assert str(on_avx2["g"].attrs[INT4_GEMV_ATTR]).split()[4:] == ["0", "8", "4"]
    assert "float32x16" not in on_avx2["g"].script()
    assert str(on_avx2["l"].attrs[INT4_LINEAR_ATTR]).split()[3:] == ["1", "64", "64"]
    assert int4_form(AVX512) | {"lut": False} == {"lut": False, "lanes": 16, "pass_vectors": 4, "rows": 4,
                                                   "columns": 64, "row_block": 64}
    assert for_target(mod, AVX512)["l"].same_as(mod["l"])


def test_shapes_and_scales_the_kernels_take():
    assert fits_int4(64, 32) and fits_int4(32000, 1024)
    assert not fits_int4(32, 64) and not fits_int4(64, 48) and not fits_int4(50257, 768)
    assert scale_dtype(np.array([1e-3, 10.0])) == "float16"
    assert scale_dtype(np.array([1e-6])) == "float32" and scale_dtype(np.array([1e5])) == "float32"
    with pytest.raises(ValueError, match="need N % 64 == 0"):
        pack_int4(np.zeros((32, 64), np.int64), np.zeros((32, 2), np.float16))
