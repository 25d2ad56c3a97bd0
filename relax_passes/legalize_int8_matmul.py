"""Legalization of ``relax.matmul`` of uint8 data by a constant int8 weight into int32
(``relax_passes.integer_qdq``'s integer form of a QDQ MatMul / Gemm), in the operand
order of AVX-512 VNNI's ``vpdpbusd`` (``schedules.cpu.conv2d_int8.VNNIMatmul``).

The weight ``B [K, N]`` is first copied to ``Bv [N/16, K/4, 16, 4]`` (four consecutive
``k`` of one output column side by side; a layout rewrite of a constant, done at compile
time by ``schedules.prepack_weights``), and::

    out[..., m, n] = sum(ko, k4) A[..., m, 4*ko + k4] * Bv[n // 16, ko, n % 16, k4]

the same products as ``A @ B``, summed in int32 (exact in any order: ``integer_qdq``
checks the sums cannot overflow). A row count that is no whole number of register tiles
(ViT's 197 tokens) is computed for the rows padded with zeros (``padded_rows``), and only
the real rows are read after: a partial tile would put a predicate on the block, which
the kernels' tensorized instructions cannot take. Any other matmul takes TVM's
legalization.

On a target with AVX2 and without AVX-512 VNNI the **pairs form** is computed instead
(``pairs_form``): the data and the weight widened to int16 (exactly), the weight copied
to ``Bp [N/8, K/2, 8, 2]``, and ``out = sum(ko, k2) A16[..., m, 2*ko + k2] * Bp[n // 8,
ko, n % 8, k2]``: one ``vpmaddwd`` per 8 columns and 2 k
(``schedules.cpu.conv2d_int8.PAIRS_INTRIN``), where AVX2's split-byte form of ``vpdpbusd``
takes 6 instructions per 32 products (BERT QDQ ran in 0.66-0.71x the time on Zen 3).  The
same products, summed in int32.
"""

from __future__ import annotations

import tvm
from tvm import te

from aicf_tvm.core.tvm_values import static_shape
from aicf_tvm.runtime.cpu_features import target_isa

from .legalize_blocked_conv import VNNI_DEPTH, VNNI_LANES

# The pairs form's columns and k per instruction (``schedules.cpu.conv2d_int8.PAIRS_LANES``
# and ``PAIRS_DEPTH``: vpmaddwd's 8 int32 lanes, two int16 products each).
PAIRS_LANES, PAIRS_DEPTH = 8, 2


def is_vnni_matmul(a_dtype: str, b_dtype: str, out_dtype: str, a_shape, b_shape) -> bool:
    """uint8 data of static shape ``[..., M, K]``, an int8 ``[K, N]``, int32 sums, ``K``
    a multiple of 4 and ``N`` of 16."""
    if (str(a_dtype), str(b_dtype), str(out_dtype)) != ("uint8", "int8", "int32"):
        return False
    if a_shape is None or b_shape is None or len(a_shape) < 2 or len(b_shape) != 2:
        return False
    k, n = b_shape
    return a_shape[-1] == k and k % VNNI_DEPTH == 0 and n % VNNI_LANES == 0


def padded_rows(m: int) -> int:
    """Rows the product is computed for: ``m`` rounded up to whole register tiles (8 rows)
    or AMX blocks (32 rows from 32 on), so no tile is partial (module docstring); ``m``
    itself when it already is, or under 8."""
    if m < 8 or m % 8 == 0 and (m < 32 or m % 32 == 0):
        return m
    step = 32 if m >= 32 else 8
    return -(-m // step) * step


def pairs_form(target: tvm.target.Target | None) -> bool:
    """Whether the matmul takes the pairs form (module docstring) on ``target``: AVX2
    without AVX-512 VNNI (whose ``vpdpbusd`` takes the bytes as they are)."""
    if target is None or target.kind.name != "llvm":
        return False
    isa = set(target_isa(target.export()))
    return "avx2" in isa and not {"avx512vnni", "avx512bw"} <= isa


def matmul_vnni(a: te.Tensor, b: te.Tensor, pairs: bool = False) -> te.Tensor:
    """The TE compute of the module docstring (``pairs``: the pairs form)."""
    k, n = (int(d) for d in b.shape)
    m = int(a.shape[-2])
    rows = padded_rows(m)
    depth, lanes = (PAIRS_DEPTH, PAIRS_LANES) if pairs else (VNNI_DEPTH, VNNI_LANES)
    if pairs:  # uint8 -> int16 and int8 -> int16: exact
        source = a
        a = te.compute((*a.shape[:-2], rows, k), lambda *i: tvm.tirx.if_then_else(
            i[-2] < m, source[i].astype("int16"), tvm.tirx.const(0, "int16")), name="data_int16")
    elif rows != m:  # rows past m are zeros; their sums are computed and never read
        source = a
        a = te.compute((*a.shape[:-2], rows, k), lambda *i: tvm.tirx.if_then_else(
            i[-2] < m, source[i], tvm.tirx.const(0, source.dtype)), name="rows_padded")
    def weight(no, ko, ni, k4):
        value = b[ko * depth + k4, no * lanes + ni]
        return value.astype("int16") if pairs else value

    bv = te.compute((n // lanes, k // depth, lanes, depth), weight, name="weight_vnni")
    ko = te.reduce_axis((0, k // depth), "rko")
    k4 = te.reduce_axis((0, depth), "rk4")
    out = te.compute((*a.shape[:-1], n), lambda *idx: te.sum(
        a[(*idx[:-1], ko * depth + k4)].astype("int32")
        * bv[idx[-1] // lanes, ko, idx[-1] % lanes, k4].astype("int32"), axis=[ko, k4]),
        name="matmul_vnni", tag="matmul_vnni")
    if rows == m:
        return out
    return te.compute((*out.shape[:-2], m, n), lambda *i: out[i], name="matmul_rows")


def legalize_matmul(bb: tvm.relax.BlockBuilder, call: tvm.relax.Call) -> tvm.relax.Expr:
    a, b = call.args
    if not is_vnni_matmul(a.ty.dtype, b.ty.dtype, call.ty.dtype, static_shape(a.ty), static_shape(b.ty)):
        return tvm.ir.Op.get("relax.matmul").get_attr("FLegalize")(bb, call)  # TVM's own
    pairs = pairs_form(tvm.target.Target.current(allow_none=True))
    return bb.call_te(matmul_vnni, a, b, pairs, primfunc_name_hint="matmul_vnni")


LEGALIZE_MAP = {"relax.matmul": legalize_matmul}

__all__ = ["LEGALIZE_MAP", "PAIRS_DEPTH", "PAIRS_LANES", "is_vnni_matmul", "legalize_matmul", "matmul_vnni",
           "padded_rows", "pairs_form"]
