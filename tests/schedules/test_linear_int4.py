"""``schedules.cpu.linear_int4``: the int4 linear kernels against numpy in float64, on
distinct random weights, scales and inputs: the one-row GEMV in its portable form
(shifts and conversions: what an AVX2 CPU runs, and it runs here too) and its AVX-512
lookup form, and the many-row kernel for row counts around its row block; float16 and
float32 scales. ``for_target`` picks the form from the target's features. The int8
activations' kernels against numpy's rounding of the input (``tests.helpers.rounded_int8_groups``: half to even, by
the group's scale), then float64: rounding ties, a group of zeros, NaN and infinity."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.target import Target

from aicf_tvm.runtime.targets import resolve_target
from schedules.cpu.conv2d_int8 import has_vnni
from schedules.cpu.linear_int4 import (
    GROUP,
    INT4_GEMV_ATTR,
    INT4_GEMV_Q8_ATTR,
    INT4_LINEAR_ATTR,
    INT4_LINEAR_Q8_ATTR,
    ROW_BLOCK,
    fits_int4,
    for_target,
    gemv_int4,
    gemv_int4_q8,
    has_lut,
    has_q8,
    int4_form,
    linear_int4,
    linear_int4_q8,
    pack_int4,
    pack_int8,
    scale_dtype,
)
from tests.helpers import rounded_int8_groups

HOST = resolve_target("llvm")
AVX2 = Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3"})
AVX512 = Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512"})
VNNI = Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4"})


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
                                                   "columns": 64, "row_block": 64, "q8_pass_vectors": 8,
                                                   "q8_vnni": False, "q8_vectors": 4}
    assert for_target(mod, AVX512)["l"].same_as(mod["l"])


def test_shapes_and_scales_the_kernels_take():
    assert fits_int4(64, 32) and fits_int4(32000, 1024)
    assert not fits_int4(32, 64) and not fits_int4(64, 48) and not fits_int4(50257, 768)
    assert scale_dtype(np.array([1e-3, 10.0])) == "float16"
    assert scale_dtype(np.array([1e-6])) == "float32" and scale_dtype(np.array([1e5])) == "float32"
    with pytest.raises(ValueError, match="need N % 64 == 0"):
        pack_int4(np.zeros((32, 64), np.int64), np.zeros((32, 2), np.float16))


Q8_FORMS = [pytest.param(False, passes, id=f"avx2-{passes}", marks=pytest.mark.skipif(
    not has_q8(HOST), reason="the int8 activations' kernel needs AVX2")) for passes in (1, 2, 4, 8)] + [
    pytest.param(True, passes, id=f"vnni-{passes}", marks=pytest.mark.skipif(
        not has_vnni(HOST), reason="the VNNI form needs AVX-512 VNNI")) for passes in (1, 2, 4)]


@pytest.mark.parametrize("scale", ["float16", "float32"])
@pytest.mark.parametrize(("n", "k"), [(64, 32), (192, 96), (128, 256)])
@pytest.mark.parametrize(("vnni", "passes"), Q8_FORMS)
def test_the_int8_activations_gemv_equals_float64_of_the_rounded_input(n, k, scale, vnni, passes):
    v, s, w = _weight(n, k, scale, n + k + passes)
    x = np.random.default_rng(k + 1).standard_normal((1, 1, k)).astype(np.float32) * 3
    x[..., 5] = 40.0  # one group of a larger scale than the others
    got = _run(gemv_int4_q8(n, k, "g", scale, (1, 1), passes, vnni), x, *pack_int4(v, s), n)
    want = rounded_int8_groups(x).astype(np.float64) @ w.T
    assert got.shape == (1, 1, n)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    exact = x.astype(np.float64) @ w.T  # the rounding of the input shows
    assert not np.allclose(got, exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())


@pytest.mark.parametrize(("vnni", "passes"), [f for f in Q8_FORMS if f.values[1] == 2])
def test_the_int8_activations_gemv_on_a_group_of_zeros_nan_and_infinity(vnni, passes):
    n, k = 64, 96
    v, s, w = _weight(n, k, "float16", 9)
    packed = pack_int4(v, s)
    kernel = gemv_int4_q8(n, k, "g", "float16", pass_vectors=passes, vnni=vnni)
    x = np.random.default_rng(2).standard_normal((1, k)).astype(np.float32)
    x[0, 32:64] = 0.0  # its scale is 1, its values 0
    got = _run(kernel, x, *packed, n)
    np.testing.assert_allclose(got, rounded_int8_groups(x).astype(np.float64) @ w.T, rtol=1e-5, atol=1e-5)
    for bad in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[0, 70] = bad
        assert np.isnan(_run(kernel, y, *packed, n)).all()


@pytest.mark.parametrize(("vnni", "passes"), [f for f in Q8_FORMS if f.values[1] == 2])
def test_the_many_row_kernel_rounds_its_rows_half_to_even_by_each_groups_scale(vnni, passes):
    """``linear_int4_q8`` with the identity as its weight gives back its
    rows rounded: a group whose largest value is 127 has the scale 1, so 2.5 -> 2, 3.5 -> 4,
    -2.5 -> -2; every row and group by its own scale, bit for bit numpy's float32."""
    k = 64
    eye = np.eye(k, dtype=np.int64)
    packed = pack_int4(eye, np.ones((k, k // GROUP), np.float16))
    x = np.random.default_rng(4).standard_normal((3, k)).astype(np.float32)
    x[0, :32] = 0.0
    x[0, :6] = [127.0, 2.5, 3.5, -2.5, 0.5, -126.5]
    x[2, 32:] = 0.0  # a group of zeros: its scale is 1
    got = _run(linear_int4_q8(k, k, "l", "float16", 2, passes, vnni), x, *packed, k)
    assert got[0, :6].tolist() == [127.0, 2.0, 4.0, -2.0, 0.0, -126.0]
    np.testing.assert_array_equal(got, rounded_int8_groups(x))
    assert not np.array_equal(got, x) and (got[2, 32:] == 0).all()


@pytest.mark.parametrize("rows", [1, 5, ROW_BLOCK + 3])
@pytest.mark.parametrize(("tile_rows", "vectors"), [(1, 1), (2, 2), (3, 4)])
@pytest.mark.parametrize(("vnni", "passes"), [f for f in Q8_FORMS if f.values[1] == 2])
def test_the_many_row_kernel_with_int8_activations_equals_float64_of_the_rounded_rows(rows, tile_rows, vectors, vnni,
                                                                                      passes):
    """Register tiles of 1, 2 and 3 rows (whole tiles and the rows left over) by 1, 2 and
    4 vectors (``passes`` only picks the ISA's form here)."""
    n, k = 128, 96
    if vectors * (16 if vnni else 8) > 64:
        pytest.skip("wider than a task's block")
    kernel = linear_int4_q8(n, k, "l", "float16", tile_rows, vectors, vnni)
    v, s, w = _weight(n, k, "float16", rows + 7)
    x = np.random.default_rng(rows).standard_normal((rows, k)).astype(np.float32)
    got = _run(kernel, x, *pack_int4(v, s), n)
    want = rounded_int8_groups(x).astype(np.float64) @ w.T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    y = x.copy()
    y[0, 3] = np.nan
    got = _run(kernel, y, *pack_int4(v, s), n)
    assert np.isnan(got[0]).all() and not np.isnan(got[1:]).any()


def test_for_target_gives_the_int8_activations_gemv_its_form_by_isa_and_refuses_a_cpu_without_avx2():
    mod = tvm.IRModule({"g": gemv_int4_q8(128, 64, "g", "float16", pass_vectors=8),
                        "l": linear_int4_q8(128, 64, "l", "float16")})
    assert str(for_target(mod, AVX2)["g"].attrs[INT4_GEMV_Q8_ATTR]).split()[4:] == ["2", "0", "4"]
    assert str(for_target(mod, AVX2)["l"].attrs[INT4_LINEAR_Q8_ATTR]).split()[3:] == ["2", "2", "64", "0", "4"]
    assert str(for_target(mod, VNNI)["l"].attrs[INT4_LINEAR_Q8_ATTR]).split()[3:] == ["2", "4", "64", "1", "4"]
    assert str(for_target(mod, AVX512)["g"].attrs[INT4_GEMV_Q8_ATTR]).split()[4:] == ["8", "0", "4"]
    assert str(for_target(mod, VNNI)["g"].attrs[INT4_GEMV_Q8_ATTR]).split()[4:] == ["4", "1", "4"]
    assert "vpdpbusd" in for_target(mod, VNNI)["g"].script() and "pmadd" not in for_target(mod, VNNI)["g"].script()
    assert has_q8(AVX2) and has_q8(AVX512)
    sse = Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64"})
    assert not has_q8(sse)
    with pytest.raises(ValueError, match="int8 activations with int4 weights need an x86 CPU with AVX2"):
        for_target(mod, sse)


@pytest.mark.skipif(not has_vnni(HOST), reason="int8 weights with int8 activations need AVX-512 VNNI")
@pytest.mark.parametrize(("n", "k"), [(64, 32), (192, 96), (128, 256)])
@pytest.mark.parametrize("rows", [1, 5, ROW_BLOCK + 3])
def test_the_int8_weight_kernels_equal_float64_of_the_rounded_input(n, k, rows):
    """``bits=8``: per-channel int8 weights (the extremes -127 and 127 included) packed 4 to a
    word (``pack_int8``), the rows rounded as numpy does; the GEMV (one row, passes of 1, 2
    and 4 vectors) and the many-row kernel (tiles of 2 x 4 and 3 x 1 and the rows left)."""
    rng = np.random.default_rng(n + k + rows)
    q = rng.integers(-127, 128, (n, k)).astype(np.int8)
    q[0, :8] = [-127, 127, -127, 127, 127, 127, -127, -127]
    s = rng.uniform(0.001, 0.02, n).astype(np.float32)
    w = q.astype(np.float64) * s[:, None].astype(np.float64)
    x = rng.standard_normal((rows, k)).astype(np.float32) * 3
    x[0, 5] = 40.0
    want = rounded_int8_groups(x).astype(np.float64) @ w.T
    packed = pack_int8(q, s)
    kernels = [linear_int4_q8(n, k, "l", "float32", 2, 4, True, bits=8),
               linear_int4_q8(n, k, "l", "float32", 3, 1, True, bits=8)]
    if rows == 1:
        kernels += [gemv_int4_q8(n, k, "g", "float32", (1,), passes, True, bits=8) for passes in (1, 2, 4)]
    for kernel in kernels:
        got = _run(kernel, x, *packed, n)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    y = x.copy()
    y[0, 3] = np.nan
    assert np.isnan(_run(kernels[0], y, *packed, n)[0]).all()


def test_int8_weights_pack_four_to_a_word_and_need_vnni():
    q = np.arange(-64, 64, dtype=np.int8).reshape(1, 128).repeat(64, axis=0)
    packed, scales = pack_int8(q, np.full(64, 0.5, np.float32))
    assert packed.shape == (1, 32, 64) and scales.shape == (1, 1, 64)
    assert packed[0, 0, 0] == np.array([-64, -63, -62, -61], np.int8).view(np.int32)[0]
    with pytest.raises(ValueError, match="VNNI form"):
        gemv_int4_q8(64, 32, "g", "float32", bits=8)
    mod = tvm.IRModule({"g": gemv_int4_q8(128, 64, "g", "float32", vnni=True, bits=8),
                        "l": linear_int4_q8(128, 64, "l", "float32", vnni=True, bits=8)})
    assert str(for_target(mod, VNNI)["l"].attrs[INT4_LINEAR_Q8_ATTR]).split()[-2:] == ["1", "8"]
    assert has_q8(VNNI, 8) and not has_q8(AVX2, 8) and not has_q8(AVX512, 8)
    with pytest.raises(ValueError, match="int8 weights need an x86 CPU with AVX-512 VNNI"):
        for_target(mod, AVX2)
