"""The helpers the CPU schedule rules share (``schedules.cpu.common``).

Each is checked on a hand-written PrimFunc or target whose answer follows from its
definition: which iterators a loop binds, the register width the target's ISA has.
"""

import pytest
from tvm import s_tir
from tvm.script import tirx as T
from tvm.target import Target

from schedules.cpu.common import (
    float32_lanes,
    gemm_tiles_by_area,
    largest_pow2_divisor,
    loop_extent,
    loop_kinds,
    output_lanes,
    vector_bits,
    vector_registers,
)


@T.prim_func(s_tir=True)
def row_sum(a: T.Buffer((4, 8), "float32"), b: T.Buffer((4,), "float32")):
    for i, k in T.grid(4, 8):
        with T.sblock("sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                b[vi] = T.float32(0)
            b[vi] = b[vi] + a[vi, vk]


@T.prim_func(s_tir=True)
def symbolic_cast(var_a: T.handle, var_b: T.handle):
    n = T.int64()
    a = T.match_buffer(var_a, (n, 16), "float32")
    b = T.match_buffer(var_b, (n, 16), "float16")
    for i, j in T.grid(n, 16):
        with T.sblock("cast"):
            vi, vj = T.axis.remap("SS", [i, j])
            b[vi, vj] = T.Cast("float16", a[vi, vj])


@pytest.mark.parametrize(("extent", "limit", "lanes"), [(64, 16, 16), (100, 16, 4), (7, 16, 1)])
def test_largest_pow2_divisor(extent: int, limit: int, lanes: int):
    assert largest_pow2_divisor(extent, limit) == lanes


def test_loop_kinds_classifies_by_binding():
    sch = s_tir.Schedule(row_sum)
    assert loop_kinds(sch, sch.get_sblock("sum")) == "SR"


def test_loop_kinds_follows_the_schedule_not_the_block():
    """A loop fused from the row loop and the reduction loop binds both iterators: 'O',
    while the block still has one spatial and one reduction iterator."""
    sch = s_tir.Schedule(row_sum)
    block = sch.get_sblock("sum")
    sch.fuse(*sch.get_loops(block))
    assert loop_kinds(sch, block) == "O"


def test_loop_extent_is_none_when_symbolic():
    sch = s_tir.Schedule(symbolic_cast)
    rows, cols = sch.get_loops(sch.get_sblock("cast"))
    assert loop_extent(sch, rows) is None
    assert loop_extent(sch, cols) == 16


AVX512 = Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512"})
NEON = Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu"})


AVX2_CPUS = ("haswell", "znver2", "znver3")


def test_vector_bits_is_the_isa_register_width():
    assert vector_bits(AVX512) == 512
    assert vector_bits(NEON) == 128
    assert vector_bits(Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4"})) == 512


@pytest.mark.parametrize("mcpu", AVX2_CPUS)
def test_avx2_cpus_get_256_bit_vectors_and_16_registers(mcpu):
    """TVM's ``llvm_get_vector_width`` answers 512 for these CPUs, which have no AVX-512."""
    target = Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": mcpu})
    assert vector_bits(target) == 256 and float32_lanes(target) == 8
    assert vector_registers(target) == 16


def test_disabling_avx512_in_mattr_halves_the_vectors():
    target = Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512",
                     "mattr": ["-avx512f"]})
    assert vector_bits(target) == 256 and vector_registers(target) == 16
    assert vector_registers(AVX512) == 32 and vector_registers(NEON) == 32


@pytest.mark.parametrize(("mcpu", "by_area"), [
    ("skylake-avx512", True), ("rocketlake", True), ("sapphirerapids", True),
    ("znver4", False), ("znver5", False), ("haswell", False), ("znver3", False),
])
def test_gemm_tiles_by_area_on_intel_avx512_cores_only(mcpu, by_area):
    """The register-tile rule measured on each family: by area on Intel's AVX-512 cores,
    widest first on AMD's Zen and wherever AVX-512 is missing (AVX2's tiles)."""
    target = Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": mcpu})
    assert gemm_tiles_by_area(target) is by_area
    assert not gemm_tiles_by_area(NEON)
    no_avx512 = Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512",
                        "mattr": ["-avx512f"]})
    assert not gemm_tiles_by_area(no_avx512)


def test_float32_lanes_and_output_lanes_count_different_elements():
    """``float32_lanes`` counts float32 values whatever the block; ``output_lanes``
    counts values of the block's own output dtype (float16 here: twice as many)."""
    sch = s_tir.Schedule(symbolic_cast)
    block = sch.get_sblock("cast")
    assert float32_lanes(AVX512) == 16 and output_lanes(AVX512, sch, block) == 32
    assert float32_lanes(NEON) == 4 and output_lanes(NEON, sch, block) == 8
