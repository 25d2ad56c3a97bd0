"""The int8 matmul on AMX (``amx-int8``: Sapphire Rapids and later Xeons): uint8 rows by an
int8 ``[K, N]`` weight into int32, 32 x 32 outputs per tile-register block.

``relax_passes.legalize_int8_matmul`` computes ``out[m, n] = sum(ko, k4) A[m, 4*ko + k4] *
Bv[n // 16, ko, n % 16, k4]``; ``Bv``'s 16 consecutive ``ko`` of one 16-column block are
one AMX ``B`` tile (16 rows of 64 bytes), 64 consecutive ``k`` of 16 rows of ``A`` one
``A`` tile. Per 32 x 32 block of outputs (four ``C`` tiles, in the kernel's local
accumulator), for every 64 ``k``: two ``A`` and two ``B`` tile loads, four ``tdpbusd``
(each a 16 x 16 x 64 product of unsigned by signed bytes into int32 sums, exact). The
tensorized block (``_intrinsic``) is the block's whole reduction over ``K``: it loads the
four ``C`` tiles from the accumulator (zeroed by the decomposed init), accumulates, and
stores them back; the epilogue (requantization) then runs on the block as in the VNNI rule.

AMX's tile data needs the operating system's permission per process (Linux:
``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); without it a tile instruction
kills the process. ``amx_permitted`` asks for it when the compiler decides, and every AMX
kernel asks again when it is called (one system call, before its parallel loop; a library
loaded in a fresh process gets it so) and raises instead of running when refused.
"""

from __future__ import annotations

import ctypes
import functools

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import TensorIntrin
from tvm.s_tir.schedule import SBlockRV
from tvm.script import tirx as T
from tvm.target import Target, codegen

from .common import _has_feature, loop_extent
from .conv2d_blocked import _place_epilogue
from .gemm_blocks import mark_prepack, schedule_injective
from .llvm_pass import llvm_prim_func_pass

TILE = 16  # rows of a tile; 64 bytes per row
BLOCK = 2 * TILE  # outputs per side of a block of four C tiles
K_STEP = 64  # k per tile product
_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18


@functools.cache
def amx_permitted() -> bool:
    """Whether this process may use AMX tile data (asked of Linux once; False elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def has_amx_int8(target: Target) -> bool:
    """The target has AMX int8 tiles and this process may use them (the target is this CPU)."""
    return _has_feature(target, "amx-int8") and _has_feature(target, "amx-tile") and amx_permitted()


def _intrinsic(k: int) -> str:
    """Register (once) and name the tensor intrinsic of a 32 x 32 block over ``k``."""
    name = f"aicf_amx_u8s8i32_32x32x{k}"
    if name in _REGISTERED:
        return name
    kg = k // 4

    @T.prim_func(s_tir=True)
    def desc(a_h: T.handle, b_h: T.handle, c_h: T.handle) -> None:
        sa = T.int64()
        sc = T.int64()
        a = T.match_buffer(a_h, (BLOCK, k), "uint8", strides=[sa, 1], offset_factor=1)
        b = T.match_buffer(b_h, (2, kg, TILE, 4), "int8", offset_factor=1)
        c = T.match_buffer(c_h, (BLOCK, BLOCK), "int32", strides=[sc, 1], offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(c[0:BLOCK, 0:BLOCK], a[0:BLOCK, 0:k], b[0:2, 0:kg, 0:TILE, 0:4])
            T.writes(c[0:BLOCK, 0:BLOCK])
            for i, j, ko, k4 in T.grid(BLOCK, BLOCK, kg, 4):
                with T.sblock("update"):
                    vi, vj, vko, vk4 = T.axis.remap("SSRR", [i, j, ko, k4])
                    c[vi, vj] = c[vi, vj] + T.cast(a[vi, vko * 4 + vk4], "int32") * T.cast(
                        b[vj // TILE, vko, vj % TILE, vk4], "int32")

    @T.prim_func(s_tir=True)
    def impl(a_h: T.handle, b_h: T.handle, c_h: T.handle) -> None:
        sa = T.int64()
        sc = T.int64()
        a = T.match_buffer(a_h, (BLOCK, k), "uint8", strides=[sa, 1], offset_factor=1)
        b = T.match_buffer(b_h, (2, kg, TILE, 4), "int8", offset_factor=1)
        c = T.match_buffer(c_h, (BLOCK, BLOCK), "int32", strides=[sc, 1], offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(c[0:BLOCK, 0:BLOCK], a[0:BLOCK, 0:k], b[0:2, 0:kg, 0:TILE, 0:4])
            T.writes(c[0:BLOCK, 0:BLOCK])
            cfg = T.alloc_buffer((64,), "uint8", scope="local")
            for i in range(64):
                cfg[i] = T.uint8(0)
            cfg[0] = T.uint8(1)  # palette 1
            for t in range(8):  # every tile 16 rows x 64 bytes
                cfg[16 + 2 * t] = T.uint8(64)
                cfg[48 + t] = T.uint8(TILE)
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.ldtilecfg", T.address_of(cfg[0])))
            ldc = T.Cast("int64", sc * 4)  # bytes per row of the int32 accumulator
            # tile numbers are immediates: every call spelled out. C tiles 0-3 (rows t // 2,
            # columns t % 2), A tiles 4-5 (rows), B tiles 6-7 (columns)
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(0), T.address_of(c[0, 0]), ldc))
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(1), T.address_of(c[0, TILE]), ldc))
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(2), T.address_of(c[TILE, 0]), ldc))
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(3), T.address_of(c[TILE, TILE]),
                                          ldc))
            for ko in range(k // K_STEP):
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(4),
                                              T.address_of(a[0, ko * K_STEP]), T.Cast("int64", sa)))
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(5),
                                              T.address_of(a[TILE, ko * K_STEP]), T.Cast("int64", sa)))
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(6),
                                              T.address_of(b[0, ko * TILE, 0, 0]), T.int64(64)))
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(7),
                                              T.address_of(b[1, ko * TILE, 0, 0]), T.int64(64)))
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tdpbusd", T.int8(0), T.int8(4), T.int8(6)))
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tdpbusd", T.int8(1), T.int8(4), T.int8(7)))
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tdpbusd", T.int8(2), T.int8(5), T.int8(6)))
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tdpbusd", T.int8(3), T.int8(5), T.int8(7)))
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.int8(0), T.address_of(c[0, 0]), ldc))
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.int8(1), T.address_of(c[0, TILE]), ldc))
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.int8(2), T.address_of(c[TILE, 0]), ldc))
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.int8(3), T.address_of(c[TILE, TILE]),
                                          ldc))

    TensorIntrin.register(name, desc, impl, override=True)
    _REGISTERED.add(name)
    return name


_REGISTERED: set[str] = set()


def amx_fits(m: int, n: int, k: int) -> bool:
    return m % BLOCK == 0 and n % BLOCK == 0 and k % K_STEP == 0


def schedule_amx_matmul(sch: s_tir.Schedule, main: SBlockRV) -> None:
    """Tasks over (32-column block, 32-row block), the block's whole reduction one
    tensorized AMX product (module docstring)."""
    for producer in sch.get_producers(main):
        if not mark_prepack(sch, producer):
            schedule_injective(sch, producer, 16)
    *lead, m, n, ko, k4 = sch.get_loops(main)
    rows = sch.fuse(*lead, m) if lead else m
    k = loop_extent(sch, ko) * 4
    mo, mi = sch.split(rows, [None, BLOCK])
    no, ni = sch.split(n, [None, BLOCK])
    sch.reorder(no, mo, mi, ni, ko, k4)
    _place_epilogue(sch, main, mo)
    task = sch.fuse(no, mo)
    sch.parallel(task)
    init = sch.decompose_reduction(main, mi)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.tensorize(mi, _intrinsic(k))


def _uses_tiles(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` loads a tile configuration (``call_llvm_intrin`` names the
    intrinsic by LLVM's id)."""
    found = []
    ldtilecfg = int(codegen.llvm_lookup_intrinsic_id("llvm.x86.ldtilecfg"))
    llvm_intrin = tvm.ir.Op.get("tirx.call_llvm_intrin")

    def visit(node: tvm.ir.Call) -> tvm.ir.Call:
        if node.op.same_as(llvm_intrin) and isinstance(node.args[0], tirx.IntImm) and \
                int(node.args[0]) == ldtilecfg:
            found.append(node)
        return node

    tvm_ffi.structural_map(func.body, [(tvm.ir.Call, visit)])
    return bool(found)


def with_permission(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` asking Linux for AMX tile data first (the calling thread, before any
    parallel loop; granted once per process, a no-op after) and raising a RuntimeError
    instead of running its tile instructions when refused; ``func`` as it was when it
    loads no tile configuration."""
    if not _uses_tiles(func):
        return func
    granted = tirx.call_extern("int64", "syscall", tirx.IntImm("int64", _SYS_ARCH_PRCTL),
                               tirx.IntImm("int64", _ARCH_REQ_XCOMP_PERM), tirx.IntImm("int64", _XFEATURE_XTILEDATA))
    # TVM 0.27's Python AssertStmt names (kind, condition) but hands them to C++ as (condition, kind)
    check = tirx.AssertStmt(granted == tirx.IntImm("int64", 0), tvm.ir.StringImm("RuntimeError"), [
        tvm.ir.StringImm("the operating system refused this process AMX tile data (arch_prctl "
                         "ARCH_REQ_XCOMP_PERM); compile for a target without amx-int8")])
    return func.with_body(tirx.SeqStmt([check, func.body]))


def AMXPermission(target: Target | None = None) -> tvm.transform.Pass:
    """PrimFunc pass applying ``with_permission`` (after lowering: the body is no block)."""
    return llvm_prim_func_pass(with_permission, target, "AMXPermission")


__all__ = ["AMXPermission", "amx_fits", "amx_permitted", "has_amx_int8", "schedule_amx_matmul", "with_permission"]
