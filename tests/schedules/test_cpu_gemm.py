"""Tests for the CPU GEMM rule (schedules/cpu/gemm.py) and its analysis and tile plan.

Each case builds the PrimFunc Relax produces for a fused matmul group (LegalizeOps +
FuseOps/FuseOpsByPattern + FuseTIR), schedules it with ``Gemm``, builds it for the host CPU
and compares it with numpy on seeded inputs. Shapes are small and deliberately not
multiples of the tiles (7x33x65, K = 401) so padding and tails are exercised.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir
from tvm.relax.dpl import is_op, wildcard

from aicf_tvm.core.options import CompileOptions
from schedules.cpu.common import plan_of
from schedules.cpu.gemm import Gemm
from schedules.cpu.gemm_analysis import IterRole, detect_gemm
from schedules.cpu.gemm_blocks import find_reduction_block
from schedules.cpu.gemm_plan import FMA_CHAINS, NC_MAX, least_padded_area, plan_candidates, plan_gemm

from ..helpers import relax_main

F32 = "float32"


@pytest.fixture(scope="module")
def target() -> tvm.target.Target:
    config = dict(tvm.target.Target.from_device(tvm.cpu()).export())
    config["num-cores"] = 2
    return tvm.target.Target(config)


def fused_primfunc(
    build: Callable[..., relax.Expr],
    inputs: dict[str, tuple[int, ...]],
    pattern=None,
) -> tvm.tirx.PrimFunc:
    """The one PrimFunc holding the reduction that Relax makes of ``build(bb, *vars)``."""
    params = [relax.Var(name, relax.TensorType(shape, F32)) for name, shape in inputs.items()]
    mod = relax_main(params, build)
    if pattern is not None:
        passes = [relax.transform.FuseOpsByPattern([("fused", pattern)])]
        passes += [relax.transform.LegalizeOps(), relax.transform.FuseTIR()]
    else:
        passes = [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern()]
        passes += [relax.transform.FuseOps(), relax.transform.FuseTIR()]
    for transform in passes:
        mod = transform(mod)
    funcs = [
        f
        for f in mod.functions.values()
        if isinstance(f, tvm.tirx.PrimFunc) and find_reduction_block(s_tir.Schedule(f)) is not None
    ]
    assert len(funcs) == 1, f"expected one reduction PrimFunc, got {len(funcs)}"
    return funcs[0]


def run_scheduled(
    sch: s_tir.Schedule, target: tvm.target.Target, arrays: dict[str, np.ndarray], out_shape
) -> np.ndarray:
    """Build the scheduled PrimFunc and run it on ``arrays`` (matched to params by name)."""
    func = sch.mod["main"].with_attr("global_symbol", "main")
    kernel = tvm.compile(tvm.IRModule({"main": func}), target=target).mod["main"]
    names = [str(p) for p in func.params][:-1]
    out = tvm.runtime.tensor(np.zeros(out_shape, np.float32))
    kernel(*[tvm.runtime.tensor(arrays[n]) for n in names], out)
    return out.numpy()


def random_inputs(shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in shapes.items()}


def check_rule(rule, func, target, arrays, expected) -> s_tir.Schedule:
    sch = rule.apply(func, target, False)
    assert sch is not None, "the rule declined a PrimFunc it supports"
    got = run_scheduled(sch, target, arrays, expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * math.sqrt(expected.size))
    return sch


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


@pytest.mark.parametrize(("m", "n", "k"), [(7, 33, 65), (64, 48, 401), (13, 100, 5)])
def test_matmul_bias_relu_matches_numpy(target, m, n, k):
    """Odd extents pad M, N (and K = 401: no tile divides it) inside the kernel."""
    shapes = {"x": (m, k), "w": (k, n), "b": (n,)}

    def build(bb, x, w, b):
        y = bb.emit(relax.op.matmul(x, w))
        return relax.op.nn.relu(bb.emit(relax.op.add(y, b)))

    a = random_inputs(shapes)
    expected = np.maximum(a["x"] @ a["w"] + a["b"], 0)
    check_rule(Gemm(), fused_primfunc(build, shapes), target, a, expected)


def test_transposed_weight_with_gelu_is_fused_into_one_kernel(target):
    """permute_dims of the weight inside the group is inlined into B's packing copy."""
    shapes = {"x": (9, 40), "w": (24, 40), "b": (24,)}

    def build(bb, x, w, b):
        y = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(w))))
        return relax.op.nn.gelu(bb.emit(relax.op.add(y, b)))

    pattern = is_op("relax.nn.gelu")(
        is_op("relax.add")(
            is_op("relax.matmul")(wildcard(), is_op("relax.permute_dims")(wildcard())), wildcard()
        )
    )
    a = random_inputs(shapes)
    expected = _gelu(a["x"] @ a["w"].T + a["b"])
    check_rule(Gemm(), fused_primfunc(build, shapes, pattern), target, a, expected)


@pytest.mark.parametrize(("m", "n", "k"), [(50, 70, 96), (26, 48, 33), (196, 96, 128)])
def test_one_k_block_runs_the_epilogue_on_each_register_tile(target, m, n, k):
    """K in one block: each tile's init sits right above its K loop and the epilogue
    (bias, then a residual read at the output's own index) right after it, inside the
    tile loop; no pass zeroes C first or reads it back after.  The same bits as the
    chunk-wide epilogue (``gemm_tile_epilogue`` False), and float64 numpy's values."""
    shapes = {"x": (m, k), "w": (k, n), "b": (n,), "r": (m, n)}

    def build(bb, x, w, b, r):
        y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, w)), b))
        return relax.op.add(y, r)

    a = random_inputs(shapes)
    want = (a["x"].astype(np.float64) @ a["w"] + a["b"] + a["r"]).astype(np.float32)
    func = fused_primfunc(build, shapes)
    tiled = check_rule(Gemm(), func, target, a, want)
    chunk = Gemm(CompileOptions(gemm_tile_epilogue=False)).apply(func, target, False)
    np.testing.assert_array_equal(run_scheduled(tiled, target, a, want.shape),
                                  run_scheduled(chunk, target, a, want.shape))

    def loops_above(sch: s_tir.Schedule, name: str) -> list:
        return [sch.get(loop) for loop in sch.get_loops(sch.get_sblock(name))]

    for sch, inside in ((tiled, True), (chunk, False)):
        update = loops_above(sch, "matmul_update")
        k_at = next(i for i, loop in enumerate(update) if int(loop.extent) == k)
        tile = update[k_at - 1]  # the loop over register tiles, above the K loop
        init = loops_above(sch, "matmul_init")
        epilogue = loops_above(sch, "T_add1")  # the two adds inlined into the second
        assert any(loop.same_as(tile) for loop in init) is inside
        assert any(loop.same_as(tile) for loop in epilogue) is inside


def test_dense_with_one_row_and_transposed_weight(target):
    """1x2048 @ 2048x1000 (a classifier head): M = 1 has no I axis at all."""
    shapes = {"x": (1, 2048), "w": (1000, 2048), "b": (1000,)}

    def build(bb, x, w, b):
        y = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(w))))
        return relax.op.add(y, b)

    pattern = is_op("relax.add")(
        is_op("relax.matmul")(wildcard(), is_op("relax.permute_dims")(wildcard())), wildcard()
    )
    a = random_inputs(shapes)
    expected = a["x"] @ a["w"].T + a["b"]
    check_rule(Gemm(), fused_primfunc(build, shapes, pattern), target, a, expected)


@pytest.mark.parametrize(
    ("x_shape", "w_shape"),
    [((3, 10, 20), (3, 20, 17)), ((2, 3, 10, 20), (2, 3, 20, 17)), ((3, 10, 20), (20, 17))],
    ids=["batched-3d", "batched-4d", "3d-times-2d"],
)
def test_batched_matmul_with_residual_silu(target, x_shape, w_shape):
    """Batch axes (S) and a 2-D weight broadcast over the batch (fused into M)."""
    out_shape = (*x_shape[:-1], w_shape[-1])
    shapes = {"x": x_shape, "w": w_shape, "r": out_shape}

    def build(bb, x, w, r):
        y = bb.emit(relax.op.nn.silu(bb.emit(relax.op.matmul(x, w))))
        return relax.op.add(y, r)

    a = random_inputs(shapes)
    expected = _silu(a["x"] @ a["w"]) + a["r"]
    check_rule(Gemm(), fused_primfunc(build, shapes), target, a, expected)


def test_returns_none_without_a_multiply_accumulate(target):
    """A sum reduction has one operand: not a GEMM, so the next rule must handle it."""
    shapes = {"x": (8, 32)}
    func = fused_primfunc(lambda bb, x: relax.op.sum(x, axis=1), shapes)
    assert Gemm().apply(func, target, False) is None



def test_returns_none_for_a_gpu_target():
    shapes = {"x": (8, 16), "w": (16, 32)}
    func = fused_primfunc(lambda bb, x, w: relax.op.matmul(x, w), shapes)
    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    assert Gemm().apply(func, cuda, False) is None


def test_detect_gemm_assigns_roles_of_a_transposed_batched_matmul():
    shapes = {"x": (3, 10, 20), "w": (3, 20, 17)}
    func = fused_primfunc(lambda bb, x, w: relax.op.matmul(x, w), shapes)
    sch = s_tir.Schedule(func)
    traits = detect_gemm(sch.get(find_reduction_block(sch)))
    assert traits is not None
    assert traits.block == (IterRole.S, IterRole.I, IterRole.J, IterRole.K)
    assert (traits.extent(IterRole.I), traits.extent(IterRole.J)) == (10, 17)


@pytest.mark.parametrize(
    ("m", "n", "k"),
    [(1, 1000, 2048), (7, 33, 65), (1024, 1024, 1024), (49, 512, 4608), (5, 7, 1031)],
)
def test_plan_tiles_divide_the_padded_problem(m, n, k):
    plan = plan_gemm(1, m, n, k, lanes=16, cores=2)
    assert plan.m_padded >= m and plan.n_padded >= n and plan.k_padded >= k
    assert plan.m_padded % plan.mc == 0 and plan.mc % plan.mr == 0
    assert plan.n_padded % plan.nc == 0 and plan.nc % plan.nr == 0
    assert plan.k_padded % plan.kc == 0 and plan.nr % plan.lanes == 0
    # accumulators + B vectors + a broadcast fit the 32 AVX-512 registers
    assert plan.mr * plan.nr // plan.lanes + plan.nr // plan.lanes + 1 <= 32


@pytest.mark.parametrize(("n", "batch", "cores"), [(1536, 1, 2), (2816, 1, 2), (3072, 1, 2), (1024, 1, 2),
                                              (768, 1, 4), (2304, 1, 4), (1536, 3, 2), (64 * 17, 1, 2)])
def test_column_blocks_split_evenly_over_the_cores_when_any_split_can(n, batch, cores):
    """The parallel loop's chunks (batch x N/nc) fill whole rounds of the cores whenever
    some block size of at most NC_MAX columns makes them, and of those the widest is
    taken: 1536 columns in 4 chunks of 384, not 3 of 512 (one core idle a third of the
    time); 17 panels of 64 have no even split, so the most even (17 chunks of one panel),
    and then the row blocks are parallel too (34 chunks)."""
    plan = plan_gemm(batch, 128, n, 1024, lanes=16, cores=cores)
    splits = [size for size in range(plan.nr, NC_MAX + 1, plan.nr) if plan.n_padded % size == 0]
    even = [size for size in splits if batch * (plan.n_padded // size) % cores == 0]
    chunks = batch * (plan.n_padded // plan.nc)
    if even:
        assert chunks % cores == 0 and plan.nc == max(even) and not plan.parallel_m
    else:
        assert plan.nc == min(splits) and plan.parallel_m
    assert plan.nc <= NC_MAX


@pytest.mark.parametrize(("m", "n", "cores", "rows"), [(784, 192, 2, True), (784, 576, 2, True),
                                                      (784, 384, 2, False), (784, 192, 3, False),
                                                      (4, 192, 2, False)])
def test_row_blocks_join_the_parallel_loop_where_column_blocks_split_unevenly(m, n, cores, rows):
    """Swin's 784 x 768 -> 192 GEMM has 3 column blocks of 64: on 2 cores the row blocks
    join the parallel loop (42 chunks); 384 columns split evenly (2 blocks of 192), 3
    blocks on 3 cores too, and one row block has nothing to add. Off with
    ``CompileOptions(gemm_rows_for_balance=False)``."""
    plan = plan_gemm(1, m, n, 768, lanes=16, cores=cores)
    assert plan.parallel_m == rows
    if rows:
        chunks = (plan.n_padded // plan.nc) * (plan.m_padded // plan.mc)
        assert chunks % cores == 0 or chunks > 8 * cores
        off = plan_gemm(1, m, n, 768, 16, cores, options=CompileOptions(gemm_rows_for_balance=False))
        assert not off.parallel_m and off.nc == plan.nc


def test_row_blocks_parallel_for_balance_match_numpy(target):
    """A GEMM whose 3 column blocks join its row blocks in the parallel loop on the 2-core
    target, with a bias and GELU epilogue, against numpy."""
    m, n, k = 112, 192, 96
    shapes = {"x": (m, k), "w": (k, n), "b": (n,)}

    def build(bb, x, w, b):
        y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, w)), b))
        return relax.op.nn.gelu(y)

    assert plan_gemm(1, m, n, k, lanes=16, cores=2).parallel_m
    a = random_inputs(shapes)
    sch = check_rule(Gemm(), fused_primfunc(build, shapes), target, a, _gelu(a["x"] @ a["w"] + a["b"]))
    assert "parallel over rows" in plan_of(sch.mod["main"])


def test_plan_blocks_symbolic_extents():
    """A symbolic M or N gets no padded size; a symbolic N one tile per block, and then the
    M strips are the parallel loop, one per iteration; a symbolic K is not blocked. Next to
    a static N, a symbolic M is blocked like a static one (a B panel serves a block of
    strips), the strips past M split off at lowering."""
    plan = plan_gemm(None, None, None, None, lanes=16, cores=2)
    assert (plan.m_padded, plan.n_padded, plan.k_padded, plan.kc) == (None, None, None, None)
    assert plan.mc == plan.mr and plan.nc == plan.nr == 32 and plan.parallel_m
    static_n = plan_gemm(None, None, 1024, 256, lanes=16, cores=2)
    assert static_n.n_padded == 1024 and static_n.kc == 256 and not static_n.parallel_m
    assert static_n.mc > static_n.mr and static_n.mc % static_n.mr == 0


@pytest.mark.parametrize(
    ("m", "n"), [(128, 3072), (128, 768), (128, 2816), (128, 256), (197, 768), (49, 512),
                 (7, 33), (64, 48)]
)
def test_tile_by_area_holds_the_most_accumulators_within_the_slack(m, n):
    """Against every tile 1..4 vectors wide with its rule-chosen mr: it pads M x N at most
    the default ``gemm_area_slack`` times the least any of them pads, none within that
    bound holds more accumulators, and of those holding as many none pads less; all fit
    the registers."""
    slack = CompileOptions().gemm_area_slack
    plan = plan_gemm(1, m, n, 768, lanes=16, cores=2, registers=32, tile_by_area=True)
    others = [plan_gemm(1, m, n, 768, lanes=16, cores=2, registers=32, nr=v * 16)
              for v in (1, 2, 3, 4)]
    work = plan.m_padded * plan.n_padded
    least = min(o.m_padded * o.n_padded for o in others)
    assert least == least_padded_area(m, n, 16)
    assert work <= least * slack
    within = [o for o in others if o.m_padded * o.n_padded <= least * slack]
    assert all(plan.mr * plan.nr >= o.mr * o.nr for o in within)
    assert all(work <= o.m_padded * o.n_padded for o in within if o.mr * o.nr == plan.mr * plan.nr)
    assert plan.mr * plan.nr // 16 + plan.nr // 16 + 1 <= 32
    assert plan in plan_candidates(1, m, n, 768, 16, 2, 32, False, False, True)


@pytest.mark.parametrize(("m", "n", "k", "tile"), [
    (128, 3072, 768, (4, 24)), (128, 768, 3072, (4, 24)), (784, 768, 3072, (4, 24)), (128, 2816, 1024, (4, 24)),
    (128, 1000, 768, (4, 24)), (197, 768, 768, None), (1500, 384, 1536, None), (96, 896, 1152, None),
    (49, 3072, 768, None), (128, 768, 384, (4, 24)), (196, 1152, 384, (4, 24)), (3136, 288, 96, (4, 24)),
    (None, 768, 768, None)])
def test_avx2_full_register_tile_where_m_has_several_blocks(m, n, k, tile):
    """16 registers (AVX2), M of several row blocks: 4 rows x 3 vectors (12 accumulators + 3
    B vectors + one broadcast = 16) where the rule's tile holds fewer accumulators (128 or
    784 rows: 4 x 2 vectors, as 6 rows would pad M) and it pads within the slack (LLaMA's
    2816 columns to 2832; 1000 to 1008). Else the rule's tile, as with the option off: 197
    or 1500 rows (6 x 2 holds 12 already), one row block (96, 49: the B panel's prefetch
    shares the registers), a symbolic M.  Where K is one block (384, 96) only when the
    epilogue calls no math function (a GELU's constants would spill the tile)."""
    plan = plan_gemm(1, m, n, k, lanes=8, cores=2, registers=16)
    rule = plan_gemm(1, m, n, k, lanes=8, cores=2, registers=16,
                     options=CompileOptions(gemm_full_register_tile=False))
    if k is not None and k <= 384:  # one K block: a math epilogue keeps the rule's tile
        assert plan_gemm(1, m, n, k, lanes=8, cores=2, registers=16, epilogue_math=True) == rule
    if tile is None:
        assert plan == rule
        return
    assert (plan.mr, plan.nr) == tile
    assert plan.mr * plan.nr // 8 + plan.nr // 8 + 1 <= 16
    if m % plan.mr == 0:
        assert plan.m_padded == m
    # never fewer accumulators than the rule's tile, and 32 registers are not affected
    assert plan.mr * plan.nr >= rule.mr * rule.nr
    assert plan_gemm(1, m, n, k, lanes=16, cores=2, registers=32) == plan_gemm(
        1, m, n, k, lanes=16, cores=2, registers=32, options=CompileOptions(gemm_full_register_tile=False))


def test_avx2_full_register_tile_kernel_matches_numpy():
    """A 4 x 3-vector tile built for an AVX2 target (K 769 padded to 896 in seven blocks, N
    padded from 112 to 120, a residual epilogue) computes what float64 numpy does."""
    target = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
    shapes = {"x": (104, 769), "w": (769, 112), "b": (112,), "r": (104, 112)}

    def build(bb, x, w, b, r):
        y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, w)), b))
        return relax.op.add(y, r)

    a = random_inputs(shapes)
    want = (a["x"].astype(np.float64) @ a["w"] + a["b"] + a["r"]).astype(np.float32)
    sch = check_rule(Gemm(), fused_primfunc(build, shapes), target, a, want)
    assert "T.unroll(T.int64(4))" in sch.mod.script() and "T.unroll(T.int64(3))" in sch.mod.script()


@pytest.mark.parametrize(("m", "n", "k", "panels"), [(1, 1024, 1024, 4), (1, 2816, 1024, 4), (1, 256, 1024, 4),
                                                     (2, 1024, 512, 2), (3, 768, 768, 1), (6, 768, 768, 1),
                                                     (None, 768, 768, 1)])
def test_avx2_one_row_tiles_span_b_panels_up_to_eight_sums(m, n, k, panels):
    """16 registers (AVX2): a tile of fewer sums than ``FMA_CHAINS`` (a decode step's 1 row
    x 2 vectors) spans 2 or 4 packed B panels, as many as the padded N divides; B keeps
    its packing (nr 16) and 32 registers are not affected."""
    plan = plan_gemm(1, m, n, k, lanes=8, cores=2, registers=16, b_constant=True)
    off = plan_gemm(1, m, n, k, lanes=8, cores=2, registers=16, b_constant=True,
                    options=CompileOptions(gemm_row_panels=False))
    assert plan.panels == panels and dataclasses.replace(plan, panels=1, nc=off.nc) == off
    assert plan.nc % (plan.nr * plan.panels) == 0
    assert plan.panels == 1 or plan.mr * plan.nr // 8 * plan.panels <= FMA_CHAINS
    assert plan_gemm(1, m, n, k, lanes=16, cores=2, registers=32, b_constant=True).panels == 1


def test_avx2_one_row_tile_of_b_panels_gives_the_same_bits():
    """A decode-like one-row GEMM (K in four blocks, a bias) built for AVX2 with its tile of
    4 B panels: numpy's float64 result, and bit for bit the result of the 1 x 2-vector tile."""
    target = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
    shapes = {"x": (1, 1024), "w": (1024, 512), "b": (512,)}

    def build(bb, x, w, b):
        return relax.op.add(bb.emit(relax.op.matmul(x, w)), b)

    a = random_inputs(shapes)
    want = (a["x"].astype(np.float64) @ a["w"] + a["b"]).astype(np.float32)
    sch = check_rule(Gemm(), fused_primfunc(build, shapes), target, a, want)
    assert "4 B panels" in (plan_of(sch.mod["main"]) or "")
    plain = Gemm(CompileOptions(gemm_row_panels=False)).apply(fused_primfunc(build, shapes), target, False)
    assert "B panels" not in (plan_of(plain.mod["main"]) or "")
    np.testing.assert_array_equal(run_scheduled(sch, target, a, want.shape),
                                  run_scheduled(plain, target, a, want.shape))


def test_tile_by_area_takes_more_rows_where_widest_first_cannot_divide_them():
    """128 rows: 4 x 4 vectors, widest first (mr 6 would pad M to 132); by area 8 x 3
    vectors pads nothing either and holds 24 accumulators instead of 16. A symbolic M or
    N keeps the widest-first rule (the tiles were measured on static shapes)."""
    widest = plan_gemm(1, 128, 3072, 768, lanes=16, cores=2)
    by_area = plan_gemm(1, 128, 3072, 768, lanes=16, cores=2, tile_by_area=True)
    assert (widest.mr, widest.nr, widest.m_padded, widest.n_padded) == (4, 64, 128, 3072)
    assert (by_area.mr, by_area.nr, by_area.m_padded, by_area.n_padded) == (8, 48, 128, 3072)
    assert (widest.kc, by_area.kc) == (256, 128)  # a 48-column B panel of 24 KiB in L1
    # LLaMA's 2816 columns: 8 x 3 pads N to 2832 (0.6%), 4 x 4 pads nothing; within the slack
    llama = plan_gemm(1, 128, 2816, 1024, lanes=16, cores=2, tile_by_area=True)
    assert (llama.mr, llama.nr, llama.m_padded, llama.n_padded) == (8, 48, 128, 2832)
    for m, n in ((None, 3072), (128, None)):
        by_area = plan_gemm(1, m, n, 768, lanes=16, cores=2, tile_by_area=True)
        assert by_area == plan_gemm(1, m, n, 768, lanes=16, cores=2)


@pytest.mark.parametrize("n", [1000, 1024, 2816, 32000, 50257, 151936, 33])
def test_one_strip_of_rows_takes_the_tile_of_a_symbolic_m(n):
    """A static M of one strip (a decode step's one row) tiles and packs B as a symbolic M
    does, by area or not: the prompt and decode functions of ``compile_causal_lm`` then
    hold a weight in one packed layout, stored once (GPT-2's 50257 columns: by area would
    take 4 vectors, padding to 50304; the rule takes 2, padding to 50272)."""
    for m in (1, 2, 6):
        for b_constant in (False, True):
            row = plan_gemm(1, m, n, 768, 16, 2, 32, True, False, True, None, b_constant)
            prompt = plan_gemm(1, None, n, 768, 16, 2, 32, True, False, False, None, b_constant)
            assert (row.nr, row.n_padded, row.k_padded) == (prompt.nr, prompt.n_padded, prompt.k_padded)
            panels = prompt.n_padded > prompt.nr  # one panel stored N-innermost is already packed
            assert row.pack_b == (b_constant and panels) and prompt.pack_b == panels
    assert plan_gemm(1, 1, 50257, 768, 16, 2, 32, tile_by_area=True).nr == 32


def test_plans_follow_the_options_the_rule_is_given():
    """The knobs of ``CompileOptions`` the A/B script switches: no area slack takes LLaMA's
    least padded tile (4 x 4 vectors), ``kc`` near 256 with the by-area tile, and the
    widest column block instead of the even split (1536 columns: 3 chunks of 512 on 2
    cores, where the even split takes 4 of 384)."""
    by_area = (1, 128, 2816, 1024, 16, 2, 32, False, False, True)
    least = plan_gemm(*by_area, CompileOptions(gemm_area_slack=1.0))
    assert (least.mr, least.nr, least.n_padded) == (4, 64, 2816)
    assert plan_gemm(*by_area, CompileOptions(gemm_kc_near_by_area=256)).kc == 256
    plain = (1, 128, 1536, 768, 16, 2, 32, False, False, False)
    assert plan_gemm(*plain).nc == 384
    assert plan_gemm(*plain, CompileOptions(gemm_even_column_blocks=False)).nc == 512


@pytest.mark.parametrize(
    ("m", "n", "k", "b_contiguous_in_n", "b_im2col"),
    [(128, 768, 3072, False, False), (7, 33, 65, False, False), (4, 256, 512, True, False),
     (64, 196, 576, False, True), (None, 1024, 256, False, False)],
)
def test_plan_candidates_start_with_the_default_and_stay_legal(m, n, k, b_contiguous_in_n, b_im2col):
    """The tuning space around the rule: its own plan first, then distinct plans that each
    tile the padded problem, fit the registers, and pack B only where packing is possible
    (never an im2col B) and needed (a B not stored N-innermost is always packed)."""
    args = (1, m, n, k, 16, 2, 32, b_contiguous_in_n, b_im2col)
    plans = plan_candidates(*args)
    assert plans[0] == plan_gemm(*args)
    assert len(plans) == len(set(plans)) > 4
    for plan in plans:
        assert plan.nr % plan.lanes == 0 and plan.mc % plan.mr == 0 and plan.nc % plan.nr == 0
        assert plan.mr * plan.nr // plan.lanes + plan.nr // plan.lanes + 1 <= 32
        if plan.m_padded is not None:
            assert plan.m_padded >= m and plan.m_padded % plan.mc == 0
        assert plan.n_padded >= n and plan.n_padded % plan.nc == 0
        if b_im2col:
            assert not plan.pack_b
        elif not b_contiguous_in_n:
            assert plan.pack_b
    assert {p.nr for p in plans} == {16, 32, 48, 64}
    assert {p.parallel_m for p in plans} == {True, False}
