"""CPU schedule rules for int8 kernels on AVX-512 VNNI: uint8 data, int8 weights, int32
sums: the blocked conv2d (``relax_passes.legalize_blocked_conv``'s VNNI form) and the
matmul (``relax_passes.legalize_int8_matmul``; on AVX2 without VNNI its int16 pairs form,
``vpmaddwd`` per 8 columns and 2 k: ``PAIRS_INTRIN``).

The nest is the float dense one (``conv2d_blocked.schedule_dense``: tasks over output
channel tiles and rows, a register tile of ``vb`` channel blocks by ``wb`` output
columns, the reduction outside the tile), with the innermost multiply-add over four
input channels at once::

    for c, r, q, io:                            # input blocks, taps, groups of 4 channels
      for x in wb (unrolled), v in vb (unrolled):
        acc[x, v, 0:16] = vpdpbusd(acc[x, v, 0:16],
                                   broadcast(in[n, c, y*s + r, x*s + q, 4*io : 4*io + 4]),
                                   wv[o*vb + v, c, r, q, io, 0:16, 0:4])

``vpdpbusd`` adds to each int32 lane the four products of unsigned bytes by signed bytes,
widened first: the sums are exact (the caller proves they fit int32), so the order
changes no value. The kernel's VNNI copy (``kernel_vnni``) is a layout rewrite of a
constant: with weights prepacked it runs once at compile time
(``schedules.prepack_weights``). The epilogue (requantization) runs on the tile, as in
the float rule.
"""

from __future__ import annotations

import functools
import math

from tvm import s_tir, tirx
from tvm.s_tir import TensorIntrin
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.s_tir.schedule import SBlockRV
from tvm.script import tirx as T
from tvm.target import Target

from aicf_tvm.core.options import CompileOptions, options_or_default

from .amx_int8 import amx_fits, has_amx_int8, schedule_amx_matmul
from .common import _has_feature, loop_extent, vector_registers
from .conv2d_blocked import (
    ConvPlan,
    _place_epilogue,
    _split_columns,
    register_tile,
    rows_outermost,
)
from .gemm_blocks import mark_prepack, schedule_injective, static_reduction_block

VNNI_INTRIN = "aicf_dot_16x4_u8i8i32_vnni_local"
AVX2_INTRIN = "aicf_dot_16x4_u8i8i32_avx2_local"
_LOW7, _HIGH1 = 0x7F7F7F7F, -0x7F7F7F80  # each byte's low 7 bits; each byte's top bit (0x80808080)
PAIRS_INTRIN = "aicf_dot_8x2_i16i16i32_avx2_local"
PAIRS_LANES, PAIRS_DEPTH = 8, 2  # int32 accumulators of one vpmaddwd, int16 products each adds


def pmaddubsw(a: tirx.Expr, b: tirx.Expr) -> tirx.Expr:
    """AVX2's ``vpmaddubsw``: unsigned bytes of ``a`` times signed bytes of ``b``, adjacent pairs into int16."""
    return T.call_llvm_pure_intrin("int16x16", "llvm.x86.avx2.pmadd.ub.sw", a, b)


def pmaddwd_ones(x: tirx.Expr) -> tirx.Expr:
    """AVX2's ``vpmaddwd`` by ones: adjacent int16 pairs of ``x`` added into int32."""
    return T.call_llvm_pure_intrin("int32x8", "llvm.x86.avx2.pmadd.wd", x, T.broadcast(T.int16(1), 16))


def _dot_description(lanes: int, depth: int, a_dtype: str, b_dtype: str) -> tirx.PrimFunc:
    """A tensor intrinsic's description: ``lanes`` int32 accumulators (in ``local`` scope,
    the register tile), each adding the ``depth`` products of ``a`` by its row of ``b``."""

    @T.prim_func(s_tir=True)
    def desc(a: T.Buffer((depth,), a_dtype, offset_factor=1), b: T.Buffer((lanes, depth), b_dtype, offset_factor=1),
             c: T.Buffer((lanes,), "int32", offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(c[0:lanes], a[0:depth], b[0:lanes, 0:depth])
            T.writes(c[0:lanes])
            for i in T.serial(0, lanes):
                for k in T.serial(0, depth):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        c[vi] = c[vi] + T.cast(a[vk], "int32") * T.cast(b[vi, vk], "int32")

    return desc


@functools.cache
def register_intrinsics() -> None:
    """Register the three tensor intrinsics (``VNNI_INTRIN``, ``AVX2_INTRIN``,
    ``PAIRS_INTRIN``) with TVM, once: on first use, not at import, since parsing TVMScript
    reads the source of every frame of the caller's stack (``inspect.stack``), 0.35 s a
    function under an import of this module (3.6 s of every model's import before)."""
    # TVM's ``dot_16x4_vnni`` with the accumulators in ``local`` scope (the register tile) and
    # byte-vector operands (the intrinsic's signature in the LLVM TVM 0.27 links): 16 int32
    # lanes, each adding the products of 4 unsigned by 4 signed bytes.
    _dot_desc = _dot_description(16, 4, "uint8", "int8")

    @T.prim_func(s_tir=True)
    def _dot_vnni(a: T.Buffer((4,), "uint8", offset_factor=1), b: T.Buffer((16, 4), "int8", offset_factor=1),
                  c: T.Buffer((16,), "int32", offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(c[0:16], a[0:4], b[0:16, 0:4])
            T.writes(c[0:16])
            a_i32 = T.reinterpret(a.vload([0], "uint8x4"), dtype="int32")
            c[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"), c.vload([0], dtype="int32x16"),
                T.reinterpret(T.broadcast(a_i32, 16), dtype="int8x64"), b.vload([0, 0], dtype="int8x64"),
                dtype="int32x16")

    # The same 16 x 4 dot product on AVX2, exact: ``vpmaddubsw`` adds two u8 x s8 products
    # into an int16 with saturation, which |a0 b0 + a1 b1| <= 255 * 256 can exceed. With the
    # data split into its low 7 bits and its top bit, each ``vpmaddubsw`` stays in range
    # (127 * 256 = 32512; 128 * (b0 + b1) in [-32768, 32512]), and ``vpmaddwd`` by ones adds
    # the pairs into int32: the same sums as vpdpbusd, in two halves of 8 lanes.
    @T.prim_func(s_tir=True)
    def _dot_avx2(a: T.Buffer((4,), "uint8", offset_factor=1), b: T.Buffer((16, 4), "int8", offset_factor=1),
                  c: T.Buffer((16,), "int32", offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(c[0:16], a[0:4], b[0:16, 0:4])
            T.writes(c[0:16])
            a_i32 = T.reinterpret(a.vload([0], "uint8x4"), dtype="int32")
            low = T.reinterpret(T.broadcast(T.bitwise_and(a_i32, T.int32(_LOW7)), 8), dtype="int8x32")
            high = T.reinterpret(T.broadcast(T.bitwise_and(a_i32, T.int32(_HIGH1)), 8), dtype="int8x32")
            for h in T.unroll(2):
                c[T.ramp(8 * h, 1, 8)] = c[T.ramp(8 * h, 1, 8)] \
                    + pmaddwd_ones(pmaddubsw(low, b.vload([8 * h, 0], dtype="int8x32"))) \
                    + pmaddwd_ones(pmaddubsw(high, b.vload([8 * h, 0], dtype="int8x32")))

    # The matmul's form on AVX2 (``legalize_int8_matmul``, pairs form): the uint8 data and int8
    # weights widened to int16 first (exactly), then ``vpmaddwd``: 8 int32 lanes, each adding
    # two int16 products.  A product is within [-32640, 32385] and a pair within
    # [-65280, 64770]: no saturation and no wrap (vpmaddwd wraps only -32768 * -32768 twice,
    # which widened bytes never are), so the sums are vpdpbusd's.  One instruction per 16
    # products where the split-byte form takes 6 per 32 (``_dot_avx2``).
    _pairs_desc = _dot_description(PAIRS_LANES, PAIRS_DEPTH, "int16", "int16")

    @T.prim_func(s_tir=True)
    def _pairs_avx2(a: T.Buffer((2,), "int16", offset_factor=1), b: T.Buffer((8, 2), "int16", offset_factor=1),
                    c: T.Buffer((8,), "int32", offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(c[0:8], a[0:2], b[0:8, 0:2])
            T.writes(c[0:8])
            a_i32 = T.reinterpret(a.vload([0], "int16x2"), dtype="int32")
            c[T.ramp(0, 1, 8)] = c[T.ramp(0, 1, 8)] + T.call_llvm_pure_intrin(
                "int32x8", "llvm.x86.avx2.pmadd.wd", T.reinterpret(T.broadcast(a_i32, 8), dtype="int16x16"),
                b.vload([0, 0], dtype="int16x16"))

    TensorIntrin.register(VNNI_INTRIN, _dot_desc, _dot_vnni, override=True)
    TensorIntrin.register(AVX2_INTRIN, _dot_desc, _dot_avx2, override=True)
    TensorIntrin.register(PAIRS_INTRIN, _pairs_desc, _pairs_avx2, override=True)


def intrinsic(name: str) -> str:
    """``name``, one of this module's tensor intrinsics, registered."""
    register_intrinsics()
    return name


# The pairs form's register tile, (8-column blocks, rows): 12 int32 accumulators.  On BERT's
# matmul shapes (128 rows, 768-3072 columns) on Zen 3 it ran in 0.88-0.91x the time of the
# float rule's 2 x 4 (2 x 5, 2 x 6 and 3 x 3 the same as 2 x 4; 1 x 8 and 4 x 2 slower),
# the same sums.
PAIRS_TILE = (3, 4)


def has_vnni(target: Target) -> bool:
    """AVX-512 VNNI (``vpdpbusd`` on 512-bit registers)."""
    return _has_feature(target, "avx512vnni") and _has_feature(target, "avx512bw")


def int8_dot(target: Target) -> str | None:
    """The tensor intrinsic of the int8 kernels on ``target``: ``vpdpbusd`` with AVX-512
    VNNI, the exact ``vpmaddubsw`` form with AVX2, None without either."""
    if has_vnni(target):
        return VNNI_INTRIN
    return AVX2_INTRIN if _has_feature(target, "avx2") else None


def _int8_reads(stmt: s_tir.SBlock) -> bool:
    """Two reads, uint8 and int8, and one int32 write."""
    return (len(stmt.reads) == 2 and len(stmt.writes) == 1 and str(stmt.writes[0].source.dtype) == "int32"
            and sorted(str(r.source.dtype) for r in stmt.reads) == ["int8", "uint8"])


def vnni_conv_block(sch: s_tir.Schedule) -> SBlockRV | None:
    """The conv block of a VNNI-form blocked conv2d PrimFunc, else None."""
    found = static_reduction_block(sch)
    if found is None or found[1] != "SSSSSRRRRR":
        return None
    stmt = sch.get(found[0])
    if not _int8_reads(stmt) or int(stmt.iter_vars[4].dom.extent) != 16 or int(stmt.iter_vars[9].dom.extent) != 4:
        return None
    return found[0]


def vnni_plan(sch: s_tir.Schedule, main: SBlockRV, target: Target, options: CompileOptions | None = None) -> ConvPlan:
    """The float rule's register tile (one int32 vector per channel block) and task order."""
    stmt = sch.get(main)
    vb, wb = register_tile(int(stmt.iter_vars[1].dom.extent), int(stmt.iter_vars[3].dom.extent), 1,
                           vector_registers(target), options_or_default(options).conv_register_tile)
    return ConvPlan(vb, wb, rows_outermost(sch, main, target))


def schedule_vnni(sch: s_tir.Schedule, main: SBlockRV, target: Target, plan: ConvPlan) -> None:
    for producer in sch.get_producers(main):
        if not mark_prepack(sch, producer):  # the kernel's VNNI copy: prepacked when a constant
            schedule_injective(sch, producer, 16)
    n, o, y, x, j, c, r, q, io, i4 = sch.get_loops(main)
    oo, oi = sch.split(o, [None, plan.channel_blocks])
    xo, xi = _split_columns(sch, x, loop_extent(sch, x), plan.columns)
    sch.reorder(n, *((y, oo) if plan.by_rows else (oo, y)), xo, c, r, q, io, xi, oi, j, i4)
    _place_epilogue(sch, main, xo)
    sch.parallel(sch.fuse(n, y) if plan.by_rows else sch.fuse(n, oo, y))
    init = sch.decompose_reduction(main, c)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.unroll(xi)
    sch.unroll(oi)
    sch.tensorize(j, intrinsic(int8_dot(target)))


def _pairs_reads(stmt: s_tir.SBlock) -> bool:
    """Two int16 reads and one int32 write (``legalize_int8_matmul``'s pairs form)."""
    return (len(stmt.reads) == 2 and len(stmt.writes) == 1 and str(stmt.writes[0].source.dtype) == "int32"
            and all(str(r.source.dtype) == "int16" for r in stmt.reads))


def matmul_lanes(stmt: s_tir.SBlock) -> int | None:
    """The int32 lanes of one instruction of a ``legalize_int8_matmul`` block: 16 for the
    byte form (``(ko, k4)``, 4 bytes per lane), 8 for the pairs form (``(ko, k2)``, two
    int16 per lane); None for another block."""
    depth, extent = int(stmt.iter_vars[-1].dom.extent), int(stmt.iter_vars[-3].dom.extent)
    if _int8_reads(stmt) and depth == 4 and extent % 16 == 0:
        return 16
    if _pairs_reads(stmt) and depth == PAIRS_DEPTH and extent % PAIRS_LANES == 0:
        return PAIRS_LANES
    return None


def vnni_matmul_block(sch: s_tir.Schedule) -> SBlockRV | None:
    """The matmul block of a ``legalize_int8_matmul`` PrimFunc (``[..., M, N]`` over
    ``(ko, k4)``, or ``(ko, k2)`` in its pairs form), else None."""
    found = static_reduction_block(sch)
    if found is None or not found[1].endswith("SSRR") or "R" in found[1][:-2]:
        return None
    return found[0] if matmul_lanes(sch.get(found[0])) is not None else None


def schedule_vnni_matmul(sch: s_tir.Schedule, main: SBlockRV, target: Target,
                         options: CompileOptions | None = None) -> None:
    """Tasks over (column tile, row tile), a register tile of ``vb`` column blocks by
    ``wb`` rows (``register_tile``, as the conv's channel blocks by columns), the whole
    reduction inside it, one instruction per (row, block, k step): ``vpdpbusd`` on 16
    columns and 4 k (or the split-byte AVX2 form of it), ``vpmaddwd`` on 8 columns and
    2 k in the pairs form."""
    for producer in sch.get_producers(main):
        if not mark_prepack(sch, producer):  # the weight's VNNI copy: prepacked when a constant
            schedule_injective(sch, producer, 16)
    *lead, m, n, ko, k4 = sch.get_loops(main)
    rows = sch.fuse(*lead, m) if lead else m
    stmt = sch.get(main)
    lanes = matmul_lanes(stmt)
    intrin = PAIRS_INTRIN if lanes == PAIRS_LANES else int8_dot(target)
    row_count = loop_extent(sch, rows)
    blocks = int(stmt.iter_vars[-3].dom.extent) // lanes
    if lanes == PAIRS_LANES and blocks % PAIRS_TILE[0] == 0 and row_count % PAIRS_TILE[1] == 0:
        vb, wb = PAIRS_TILE
    else:
        vb, wb = register_tile(blocks, row_count, 1, vector_registers(target),
                               options_or_default(options).conv_register_tile)
    # rows that divide the count: a partial last tile would put a predicate on the block,
    # which tensorize cannot match (197 tokens, a prime, take one row per tile)
    wb = max(d for d in range(1, wb + 1) if row_count % d == 0)
    no, ni = sch.split(n, [None, lanes])
    noo, noi = sch.split(no, [None, vb])
    mo, mi = sch.split(rows, [None, wb])
    sch.reorder(noo, mo, ko, mi, noi, ni, k4)
    _place_epilogue(sch, main, mo)
    sch.parallel(sch.fuse(noo, mo))
    init = sch.decompose_reduction(main, ko)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.unroll(mi)
    sch.unroll(noi)
    sch.tensorize(ni, intrinsic(intrin))


class _VNNIRule(CPUScheduleRule):
    """A rule for an int8 kernel on a target with an int8 dot product (``int8_dot``:
    AVX-512 VNNI, or AVX2): ``find`` the block, then ``schedule`` it; None for anything else."""

    needs_vnni = False  # the convolutions' blocked layouts exist with VNNI only

    def __init__(self, options: CompileOptions | None = None) -> None:
        self.options = options

    def find(self, sch: s_tir.Schedule) -> SBlockRV | None:
        raise NotImplementedError

    def schedule(self, sch: s_tir.Schedule, main: SBlockRV, target: Target) -> None:
        raise NotImplementedError

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target) or int8_dot(target) is None \
                or (self.needs_vnni and not has_vnni(target)):
            return None
        try:
            sch = s_tir.Schedule(func)
            main = self.find(sch)
            if main is None:
                return None
            self.schedule(sch, main, target)
        except (RuntimeError, ValueError):  # ScheduleError / InternalError: not our shape
            return None
        return [sch] if tunable else sch


class VNNIMatmul(_VNNIRule):
    """The int8 matmul on a target with AVX-512 VNNI or AVX2 (``int8_dot``), on AMX tiles
    where the target has them and the shape takes whole 32 x 32 x 64 blocks
    (``amx_int8``); None for anything else."""

    def find(self, sch: s_tir.Schedule) -> SBlockRV | None:
        return vnni_matmul_block(sch)

    def schedule(self, sch: s_tir.Schedule, main: SBlockRV, target: Target) -> None:
        *_, m, n, ko, _ = (int(iv.dom.extent) for iv in sch.get(main).iter_vars)
        rows = m * math.prod(int(iv.dom.extent) for iv in sch.get(main).iter_vars[:-4])
        if matmul_lanes(sch.get(main)) == 16 and has_amx_int8(target) and amx_fits(rows, n, 4 * ko):
            schedule_amx_matmul(sch, main)
        else:
            schedule_vnni_matmul(sch, main, target, self.options)


class VNNIConv2d(_VNNIRule):
    """The int8 blocked conv2d on a target with AVX-512 VNNI; None for anything else."""

    needs_vnni = True

    def find(self, sch: s_tir.Schedule) -> SBlockRV | None:
        return vnni_conv_block(sch)

    def schedule(self, sch: s_tir.Schedule, main: SBlockRV, target: Target) -> None:
        schedule_vnni(sch, main, target, vnni_plan(sch, main, target, self.options))


__all__ = ["AVX2_INTRIN", "PAIRS_DEPTH", "PAIRS_INTRIN", "PAIRS_LANES", "PAIRS_TILE", "VNNIConv2d", "VNNIMatmul",
           "has_vnni", "int8_dot", "matmul_lanes", "schedule_vnni", "schedule_vnni_matmul", "vnni_conv_block",
           "vnni_matmul_block", "vnni_plan"]
