"""CPU Reduction rule: softmax, norms, pooling, mean/sum, fused attention.

Each case lowers a small Relax function the way our pipeline does (LegalizeOps, then
FuseOps/FuseTIR or FuseOpsByPattern), schedules its PrimFuncs with the rule, and compares
the VM output with numpy on seeded inputs.
"""

import re
from collections.abc import Callable

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir, tirx
from tvm.relax.dpl import is_op, wildcard
from tvm.script import relax as R
from tvm.target import Target

from relax_passes.legalize_norms import LEGALIZE_MAP as NORMS
from schedules import apply_default_schedules
from schedules.cpu import Reduction
from schedules.cpu.common import float32_lanes
from schedules.cpu.reduction import is_cheap_copy, leading_spatial

TARGET = Target({**Target.from_device(tvm.cpu()).export(), "num-cores": 2})
FUSE = [
    relax.transform.AnnotateTIROpPattern(),
    relax.transform.FuseOps(),
    relax.transform.FuseTIR(),
]


def relax_module(shapes: list[tuple], body: Callable, fuse_pattern=None,
                 legalize: dict | None = None) -> tvm.IRModule:
    """A legalized (by TVM, but for the entries of ``legalize``), fused module whose
    ``main`` computes ``body(*params)``."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"p{i}", R.Tensor(shape, "float32")) for i, shape in enumerate(shapes)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(*params))
        bb.emit_func_output(out)
    mod = bb.get()
    if fuse_pattern is not None:
        mod = relax.transform.FuseOpsByPattern(
            [("fused", fuse_pattern)], bind_constants=False, annotate_codegen=False
        )(mod)
        passes = [relax.transform.LegalizeOps(legalize), relax.transform.FuseTIR()]
    else:
        passes = [relax.transform.LegalizeOps(legalize), *FUSE]
    return tvm.transform.Sequential([*passes, relax.transform.DeadCodeElimination()])(mod)


def prim_funcs(mod: tvm.IRModule) -> dict[str, tirx.PrimFunc]:
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}


def run(mod: tvm.IRModule, inputs: list[np.ndarray]) -> np.ndarray:
    ex = tvm.compile(mod, target=TARGET)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()


def check_rule(mod: tvm.IRModule, inputs: list[np.ndarray], expected: np.ndarray) -> str:
    """Schedule every PrimFunc with Reduction (all must accept), compare with numpy,
    and return the scheduled TVMScript for structural assertions."""
    for name, func in prim_funcs(mod).items():
        sch = Reduction().apply(func, TARGET, False)
        assert sch is not None, f"Reduction rejected {name}"
        mod[name] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
    np.testing.assert_allclose(run(mod, inputs), expected, rtol=1e-5, atol=1e-5)
    return "\n".join(f.script() for f in prim_funcs(mod).values())


def np_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_softmax_last_axis_is_row_parallel_and_vectorized(rand):
    x = rand(2, 4, 8, 64)
    mod = relax_module([x.shape], lambda p: relax.op.nn.softmax(p, axis=-1))
    script = check_rule(mod, [x], np_softmax(x, -1))
    assert "T.parallel" in script and "T.vectorized" in script


def test_softmax_inner_axis_uses_fewer_row_axes(rand):
    """Rows (n, h, w) of the max block and (n, c, h) of the output disagree: fusing three
    row axes would recompute the max per channel, so the rule settles for n alone."""
    x = rand(2, 16, 8, 16)
    mod = relax_module([x.shape], lambda p: relax.op.nn.softmax(p, axis=1))
    check_rule(mod, [x], np_softmax(x, 1))


def test_layer_norm(rand):
    x, g, b = rand(4, 16, 64), rand(64), rand(64)
    mod = relax_module(
        [x.shape, g.shape, b.shape], lambda p, q, r: relax.op.nn.layer_norm(p, q, r, axes=[-1])
    )
    mean = x.mean(-1, keepdims=True)
    expected = (x - mean) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b
    script = check_rule(mod, [x, g, b], expected)
    assert "T.parallel" in script


def test_rms_norm(rand):
    x, g = rand(4, 16, 64), rand(64)
    mod = relax_module([x.shape, g.shape], lambda p, q: relax.op.nn.rms_norm(p, q, axes=[-1]))
    expected = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g
    script = check_rule(mod, [x, g], expected)
    # 64 rows on 2 cores: tasks of 8 rows, the sum of squares stepping them together
    assert re.search(r"T\.unroll\((T\.int64\()?8\)", script)


@pytest.mark.parametrize("norm", ["layer_norm", "softmax"])
def test_row_norms_interleave_rows_with_the_same_bits(rand, norm):
    """64 rows of a norm on 2 cores: tasks of 8 rows whose serial reductions step the 8
    rows together (unrolled under the reduction loop), each row still summed in order,
    so the output equals TVM's own build bit for bit, NaN, inf and -0 rows included."""
    x, g, b = rand(2, 32, 96), rand(96), rand(96)
    x[0, 3, 5], x[0, 4, 7], x[1, 9, :] = np.nan, np.inf, -0.0
    body = {
        "layer_norm": lambda p, q, r: relax.op.nn.layer_norm(p, q, r, axes=[-1]),
        "softmax": lambda p, q, r: relax.op.nn.softmax(p, axis=-1),
    }[norm]
    mod = relax_module([x.shape, g.shape, b.shape], body)
    reference = run(mod, [x, g, b])  # unscheduled: TVM's own build
    other = run(mod, [x[::-1].copy(), g, b])
    assert not np.array_equal(reference, other, equal_nan=True)  # the output depends on x
    for name, func in prim_funcs(mod).items():
        sch = Reduction().apply(func, TARGET, False)
        assert sch is not None, f"Reduction rejected {name}"
        mod[name] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
    out = run(mod, [x, g, b])
    assert np.array_equal(out.view(np.int32), reference.view(np.int32))
    script = "\n".join(f.script() for f in prim_funcs(mod).values())
    assert re.search(r"T\.parallel\((T\.int64\()?8\)", script)
    assert re.search(r"T\.unroll\((T\.int64\()?8\)", script)


def test_vector_partial_sums_step_rows_together_with_the_same_bits(rand):
    """A layer norm over 1000 as ``relax_passes.legalize_norms`` writes it: 10 partial sums
    a row (one vector where a vector holds 10 floats: AVX-512); 64 rows on 2 cores make
    tasks of 8 rows, which each partial-sum pass steps together (the rows' loop unrolled
    inside the reduction, around the vector loop; with 8 lanes, AVX2, inside the loop over
    the partial sums): 8 independent chains, each row adding in its own order, so the
    output equals TVM's own build bit for bit, NaN, inf and -0 rows included."""
    x, g, b = rand(64, 1000), rand(1000), rand(1000)
    x[3, 5], x[4, 7], x[9, :] = np.nan, np.inf, -0.0
    mod = relax_module([x.shape, g.shape, b.shape],
                       lambda p, q, r: relax.op.nn.layer_norm(p, q, r, axes=[-1]), legalize=NORMS)
    reference = run(mod, [x, g, b])  # unscheduled: TVM's own build
    assert not np.array_equal(reference, run(mod, [x[::-1].copy(), g, b]), equal_nan=True)
    for name, func in prim_funcs(mod).items():
        sch = Reduction().apply(func, TARGET, False)
        assert sch is not None, f"Reduction rejected {name}"
        mod[name] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
    assert np.array_equal(run(mod, [x, g, b]).view(np.int32), reference.view(np.int32))
    script = "\n".join(f.script() for f in prim_funcs(mod).values())
    if float32_lanes(TARGET) >= 10:
        stepped = (r"for \w+ in T\.unroll\((T\.int64\()?8\)+:\s+"
                   r"for \w+ in T\.vectorized\((T\.int64\()?10\)")
        assert len(re.findall(stepped, script)) == 6  # the three passes: their inits and updates
    else:
        stepped = (r"for \w+ in range\((T\.int64\()?10\)+:\s+"
                   r"for \w+ in T\.unroll\((T\.int64\()?8\)")
        assert len(re.findall(stepped, script)) == 3  # the three passes' updates


def test_row_groups_with_a_partial_task_and_the_residual_output(rand):
    """A pre-norm layer's residual add + layer norm over 197 rows (ViT's tokens, a prime):
    tasks of 8 rows, the last one 5 rows under a predicate, the residual sum a second
    output in its own row loop; both outputs equal TVM's own build bit for bit, with
    NaN, inf and -0 rows in the first task and in the partial one."""
    x, r, g, b = rand(1, 197, 96), rand(1, 197, 96), rand(96), rand(96)
    x[0, 3, 5], x[0, 194, 7], x[0, 9, :], x[0, 196, :] = np.nan, np.inf, -0.0, -0.0
    r[0, 9, :], r[0, 196, :] = -0.0, -0.0

    def body(p, q, gamma, beta):
        added = relax.op.add(p, q)
        return relax.Tuple([added, relax.op.nn.layer_norm(added, gamma, beta, axes=[-1])])

    add_norm = is_op("relax.nn.layer_norm")(is_op("relax.add")(wildcard(), wildcard()), wildcard(), wildcard())
    mod = relax_module([x.shape, r.shape, g.shape, b.shape], body, fuse_pattern=add_norm)
    assert len(prim_funcs(mod)) == 1  # one kernel writing both outputs

    def outputs(module: tvm.IRModule, inputs: list[np.ndarray]) -> list[np.ndarray]:
        vm = relax.VirtualMachine(tvm.compile(module, target=TARGET), tvm.cpu())
        return [t.numpy() for t in vm["main"](*[tvm.runtime.tensor(a) for a in inputs])]

    reference = outputs(mod, [x, r, g, b])
    other = outputs(mod, [x[:, ::-1].copy(), r, g, b])
    assert not np.array_equal(reference[1], other[1], equal_nan=True)  # the output depends on x
    for name, func in prim_funcs(mod).items():
        sch = Reduction().apply(func, TARGET, False)
        assert sch is not None, f"Reduction rejected {name}"
        mod[name] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
    for out, ref in zip(outputs(mod, [x, r, g, b]), reference):
        assert np.array_equal(out.view(np.int32), ref.view(np.int32))
    script = "\n".join(f.script() for f in prim_funcs(mod).values())
    assert re.search(r"T\.parallel\((T\.int64\()?25\)", script)  # ceil(197 / 8) tasks
    assert re.search(r"T\.unroll\((T\.int64\()?8\)", script)
    assert "< T.int64(197)" in script  # the partial task's predicate


def test_strided_max_pool_keeps_windows_scalar(rand):
    """Stride 2 would make the width vector a gather: the rule leaves it scalar."""
    x = rand(2, 8, 16, 32)
    mod = relax_module(
        [x.shape], lambda p: relax.op.nn.max_pool2d(p, pool_size=(2, 2), strides=(2, 2))
    )
    expected = x.reshape(2, 8, 8, 2, 16, 2).max(axis=(3, 5))
    script = check_rule(mod, [x], expected)
    assert "T.vectorized" not in script


def test_unit_stride_max_pool_vectorizes_output_width(rand):
    """The window loops move outside the output-width loop, which becomes a vector."""
    x = rand(1, 4, 8, 16)
    mod = relax_module(
        [x.shape],
        lambda p: relax.op.nn.max_pool2d(p, pool_size=(3, 3), strides=(1, 1), padding=(1, 1)),
    )
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    script = check_rule(mod, [x], windows.max(axis=(-2, -1)))
    assert "T.vectorized" in script


def test_global_avg_pool(rand):
    x = rand(2, 32, 7, 7)
    mod = relax_module([x.shape], lambda p: relax.op.nn.adaptive_avg_pool2d(p, (1, 1)))
    check_rule(mod, [x], x.mean(axis=(2, 3), keepdims=True))


def test_mean_over_inner_axes(rand):
    x = rand(2, 8, 8, 16)
    mod = relax_module([x.shape], lambda p: relax.op.mean(p, axis=[2, 3]))
    check_rule(mod, [x], x.mean(axis=(2, 3)))


def test_sum_over_middle_axis_vectorizes_contiguous_axis(rand):
    x = rand(2, 8, 4, 32)
    mod = relax_module([x.shape], lambda p: relax.op.sum(p, axis=[1]))
    script = check_rule(mod, [x], x.sum(axis=1))
    assert "T.vectorized" in script


def attention(q, k, v, mask):
    scores = relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2]))
    scores = relax.op.add(relax.op.multiply(scores, relax.const(0.25, "float32")), mask)
    return relax.op.matmul(relax.op.nn.softmax(scores, axis=-1), v)


ATTENTION = is_op("relax.matmul")(
    is_op("relax.nn.softmax")(
        is_op("relax.add")(
            is_op("relax.multiply")(
                is_op("relax.matmul")(wildcard(), is_op("relax.permute_dims")(wildcard())),
                wildcard(),
            ),
            wildcard(),
        )
    ),
    wildcard(),
)


def test_fused_attention_is_one_primfunc_with_two_matmuls(rand):
    q, k, v, m = rand(1, 2, 32, 16), rand(1, 2, 32, 16), rand(1, 2, 32, 16), rand(1, 2, 32, 32)
    mod = relax_module([q.shape, k.shape, v.shape, m.shape], attention, ATTENTION)
    funcs = prim_funcs(mod)
    assert len(funcs) == 1
    reductions = sum(
        1
        for info in s_tir.dlight.analysis.normalize_prim_func(
            s_tir.Schedule(next(iter(funcs.values())))
        )
        if not info.is_injective()
    )
    assert reductions == 4  # q@k^T, max, sum, p@v
    expected = np_softmax(q @ k.transpose(0, 1, 3, 2) * 0.25 + m, -1) @ v
    script = check_rule(mod, [q, k, v, m], expected)
    assert "T.vectorized" in script


def test_attention_scores_read_a_transposed_key_copy_made_once(rand):
    """kᵀ is materialized once at the root (parallel, vectorized), not per row: the
    q·kᵀ reduction then vectorizes over the keys (a contiguous axis of the copy) with the
    head dimension outside, instead of a serial dot product per score."""
    q, k, v, m = rand(1, 2, 32, 16), rand(1, 2, 32, 16), rand(1, 2, 32, 16), rand(1, 2, 32, 32)
    mod = relax_module([q.shape, k.shape, v.shape, m.shape], attention, ATTENTION)
    [func] = prim_funcs(mod).values()
    sch = Reduction().apply(func, TARGET, False)
    root = sch.get_child_blocks(sch.get_sblock("root"))
    [copy] = [b for b in root if "transpose" in sch.get(b).name_hint or "permute" in sch.get(b).name_hint]
    copy_loops = sch.get_loops(copy)
    assert len(copy_loops) <= 3 and sch.get(copy_loops[0]).kind == tirx.ForKind.PARALLEL
    assert sch.get(copy_loops[-1]).kind == tirx.ForKind.VECTORIZED
    script = sch.mod["main"].script()
    update = script[script.index('sblock("matmul_update")') - 400: script.index('sblock("matmul_update")')]
    assert "T.vectorized" in update, "the scores reduction is not vectorized over the keys"
    expected = np_softmax(q @ k.transpose(0, 1, 3, 2) * 0.25 + m, -1) @ v
    check_rule(mod, [q, k, v, m], expected)


def scaled_key_attention(q, k, v, mask):
    """SDPA's decomposition: √scale on q and on kᵀ, not on the scores."""
    s = relax.const(0.5, "float32")
    kt = relax.op.multiply(relax.op.permute_dims(k, [0, 1, 3, 2]), s)
    scores = relax.op.add(relax.op.matmul(relax.op.multiply(q, s), kt), mask)
    return relax.op.matmul(relax.op.nn.softmax(scores, axis=-1), v)


SCALED_KEY_ATTENTION = is_op("relax.matmul")(
    is_op("relax.nn.softmax")(is_op("relax.add")(
        is_op("relax.matmul")(is_op("relax.multiply")(wildcard(), wildcard()),
                              is_op("relax.multiply")(is_op("relax.permute_dims")(wildcard()), wildcard())),
        wildcard())),
    wildcard(),
)


def test_scores_reduction_keeps_several_vector_accumulators(rand):
    """The q·(kᵀ·√s) reduction over 128 keys keeps 4 unrolled vector accumulators: one
    alone waits out the add latency on every step of the head dimension."""
    q, k, v, m = rand(1, 2, 32, 16), rand(1, 2, 128, 16), rand(1, 2, 128, 16), rand(1, 2, 32, 128)
    mod = relax_module([q.shape, k.shape, v.shape, m.shape], scaled_key_attention, SCALED_KEY_ATTENTION)
    [func] = prim_funcs(mod).values()
    sch = Reduction().apply(func, TARGET, False)
    assert sch is not None
    script = sch.mod["main"].script()
    update = script[script.index('sblock("matmul_update")') - 300: script.index('sblock("matmul_update")')]
    assert "T.unroll(T.int64(4))" in update and "T.vectorized" in update
    expected = np_softmax((q * 0.5) @ (k.transpose(0, 1, 3, 2) * 0.5) + m, -1) @ v
    check_rule(mod, [q, k, v, m], expected)


def test_attention_through_the_pass_inside_target_scope(rand):
    q, k, v, m = rand(2, 2, 16, 8), rand(2, 2, 16, 8), rand(2, 2, 16, 8), rand(2, 2, 16, 16)
    mod = relax_module([q.shape, k.shape, v.shape, m.shape], attention, ATTENTION)
    with TARGET:
        mod = apply_default_schedules()(mod)
    assert all(f.attrs["tirx.is_scheduled"] for f in prim_funcs(mod).values())
    expected = np_softmax(q @ k.transpose(0, 1, 3, 2) * 0.25 + m, -1) @ v
    np.testing.assert_allclose(run(mod, [q, k, v, m]), expected, rtol=1e-5, atol=1e-5)


def test_rejects_all_spatial_functions():
    mod = relax_module([(4, 64)], lambda p: relax.op.exp(p))
    (func,) = prim_funcs(mod).values()
    assert Reduction().apply(func, TARGET, False) is None


def test_rejects_full_reduction_without_rows():
    mod = relax_module([(64, 64)], lambda p: relax.op.sum(p))
    (func,) = prim_funcs(mod).values()
    assert Reduction().apply(func, TARGET, False) is None


def test_rejects_non_cpu_target():
    mod = relax_module([(4, 64)], lambda p: relax.op.nn.softmax(p))
    (func,) = prim_funcs(mod).values()
    assert Reduction().apply(func, Target({"kind": "cuda", "arch": "sm_90"}), False) is None


@pytest.mark.parametrize(("kinds", "count"), [("SSSR", 3), ("RS", 0), ("", 0), ("SS", 2)])
def test_leading_spatial(kinds: str, count: int):
    assert leading_spatial(kinds) == count


def test_is_cheap_copy_accepts_casts_only():
    mod = relax_module(
        [(4, 8)], lambda p: relax.op.nn.rms_norm(p, relax.const(np.ones(8, "float32")), axes=[-1])
    )
    (func,) = prim_funcs(mod).values()
    sch = s_tir.Schedule(func)
    cheap = {
        info.name
        for info in s_tir.dlight.analysis.normalize_prim_func(sch)
        if is_cheap_copy(sch.get(info.block_rv))
    }
    assert "T_cast" in cheap
    assert "T_multiply" not in cheap


def test_symbolic_batch_softmax_with_epilogue(rand):
    """Row count known only at run time: the no-recompute check is proved symbolically."""
    n = tirx.Var("n", "int64")
    x = relax.Var("x", R.Tensor((n, 64), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.softmax(x))
            out = bb.emit_output(relax.op.add(relax.op.exp(y), y))
        bb.emit_func_output(out)
    passes = [relax.transform.LegalizeOps(), *FUSE]
    mod = tvm.transform.Sequential(passes)(bb.get())
    a = rand(37, 64)
    s = np_softmax(a, -1)
    script = check_rule(mod, [a], np.exp(s) + s)
    assert "T.parallel" in script
