"""The GEMM K loop's accumulators in registers and the next B panel prefetched
(``schedules.cpu.gemm_prefetch``).

The structural cases run the rewrite on hand-written lowered TIR shaped like the BLIS
nest ``tile_gemm`` marks: the accumulator accesses move to a ``local`` tile loaded before
the K loop and stored after it, and the loop prefetches the next panel's row.  Where the
promotion is not proven (the accumulator is a parameter, two indices name overlapping
elements, an index moves with ``k``) the loop is left as it was.  The build case compiles
two linear layers through ``aicf_tvm`` and checks the prefetch reaches LLVM, the output
against PyTorch, and the same bits as a build without the loop marks.
"""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import tirx
from tvm.script import tirx as T
from tvm.sym.analyzer import Analyzer

import aicf_tvm
from schedules.cpu.gemm_prefetch import K_BLOCK, K_LOOP, K_SUMS, PANEL, STRIP, prefetch_next_panel
from schedules.cpu.stack_tiles import DISABLE_LOWER_BUILTIN

torch = pytest.importorskip("torch")


@T.prim_func
def nest(A: T.Buffer((64,), "float32"), B: T.Buffer((2048,), "float32"), C: T.Buffer((128,), "float32")):
    acc = T.alloc_buffer((8,), "float32x16")
    for i in range(8):
        acc[i] = T.Broadcast(T.float32(0), 16)
    for kb in T.serial(2, annotations={K_BLOCK: 1}):
        for j in T.serial(2, annotations={PANEL: 1}):
            for s in T.serial(2, annotations={STRIP: 1}):
                for k in T.serial(16, annotations={K_LOOP: 2}):
                    acc[j * 4 + s * 2] = acc[j * 4 + s * 2] + T.Broadcast(A[s * 32 + kb * 16 + k], 16) * B[
                        T.Ramp(j * 1024 + kb * 512 + k * 32, 1, 16)]
                    acc[j * 4 + s * 2 + 1] = acc[j * 4 + s * 2 + 1] + T.Broadcast(A[s * 32 + kb * 16 + k], 16) * B[
                        T.Ramp(j * 1024 + kb * 512 + k * 32 + 16, 1, 16)]
    for i in range(8):
        C[i * 16:i * 16 + 16] = acc[i]


@T.prim_func
def param_acc(A: T.Buffer((64,), "float32"), B: T.Buffer((2048,), "float32"), C: T.Buffer((8,), "float32x16")):
    for j in T.serial(2, annotations={PANEL: 1}):
        for k in T.serial(16, annotations={K_LOOP: 2}):
            C[j] = C[j] + T.Broadcast(A[k], 16) * B[T.Ramp(j * 1024 + k * 32, 1, 16)]


@T.prim_func
def overlapping(A: T.Buffer((64,), "float32"), B: T.Buffer((2048,), "float32"), C: T.Buffer((64,), "float32")):
    acc = T.alloc_buffer((64,), "float32")
    for j in T.serial(2, annotations={PANEL: 1}):
        for k in T.serial(16, annotations={K_LOOP: 2}):
            acc[T.Ramp(j * 32, 1, 16)] = acc[T.Ramp(j * 32, 1, 16)] + T.Broadcast(A[k], 16) * B[
                T.Ramp(j * 1024 + k * 32, 1, 16)]
            acc[T.Ramp(j * 32 + 8, 1, 16)] = acc[T.Ramp(j * 32 + 8, 1, 16)] + T.Broadcast(A[k], 16) * B[
                T.Ramp(j * 1024 + k * 32 + 16, 1, 16)]
    for i in range(64):
        C[i] = acc[i]


@T.prim_func
def moving_index(A: T.Buffer((64,), "float32"), B: T.Buffer((2048,), "float32"), C: T.Buffer((256,), "float32")):
    acc = T.alloc_buffer((32,), "float32x16")
    for j in T.serial(2, annotations={PANEL: 1}):
        for k in T.serial(16, annotations={K_LOOP: 2}):
            acc[j * 16 + k] = acc[j * 16 + k] + T.Broadcast(A[k], 16) * B[T.Ramp(j * 1024 + k * 32, 1, 16)]
    for i in range(16):
        C[i * 16:i * 16 + 16] = acc[i]


@T.prim_func
def blocked(A: T.Buffer((64,), "float32"), B: T.Buffer((2048,), "float32"), C: T.Buffer((64,), "float32")):
    acc = T.alloc_buffer((4,), "float32x16")
    for i in range(4):
        acc[i] = T.Broadcast(T.float32(0), 16)
    for kb in T.serial(4, annotations={K_BLOCK: 1}):
        for j in T.serial(2):
            for k in T.serial(16, annotations={K_SUMS: 1}):
                acc[j * 2] = acc[j * 2] + T.Broadcast(A[kb * 16 + k], 16) * B[
                    T.Ramp(j * 1024 + kb * 256 + k * 16, 1, 16)]
                acc[j * 2 + 1] = acc[j * 2 + 1] + T.Broadcast(A[kb * 16 + k] * T.float32(0.5), 16) * B[
                    T.Ramp(j * 1024 + kb * 256 + k * 16, 1, 16)]
    for i in range(4):
        C[i * 16:i * 16 + 16] = acc[i]


@T.prim_func
def not_a_sum(A: T.Buffer((64,), "float32"), B: T.Buffer((2048,), "float32"), C: T.Buffer((32,), "float32")):
    acc = T.alloc_buffer((2,), "float32x16")
    for kb in T.serial(4, annotations={K_BLOCK: 1}):
        for k in T.serial(16, annotations={K_SUMS: 1}):
            acc[0] = acc[0] * B[T.Ramp(kb * 256 + k * 16, 1, 16)]
            acc[1] = T.max(acc[1], B[T.Ramp(kb * 256 + k * 16 + 1024, 1, 16)])
    for i in range(2):
        C[i * 16:i * 16 + 16] = acc[i]


def _k_loops(func: tirx.PrimFunc) -> list[tirx.For]:
    found: list[tirx.For] = []
    tvm_ffi.structural_walk(func.body, [(tirx.For, lambda f: found.append(f) if f.extent.value == 16 else None)])
    return found


def _all_loops(func: tirx.PrimFunc) -> list[tirx.For]:
    found: list[tirx.For] = []
    tvm_ffi.structural_walk(func.body, [(tirx.For, found.append)])
    return found


def _buffers(stmt) -> set[str]:
    names: set[str] = set()
    tvm_ffi.structural_walk(stmt, [(tirx.BufferStore, lambda s: names.add(s.buffer.name))])
    return names


def test_promotes_the_tile_and_prefetches_the_next_panel():
    out = prefetch_next_panel(nest)
    (k_loop,) = _k_loops(out)
    assert _buffers(k_loop.body) == {"acc_tile"}  # no access to the workspace inside
    assert K_LOOP not in k_loop.annotations
    calls = []
    tvm_ffi.structural_walk(
        k_loop.body, [(tvm.ir.Call, lambda c: calls.append(c) if c.op.name == "tirx.prefetch" else None)])
    (call,) = calls
    index = call.args[0].args[0].indices[0]
    loops = {v.loop_var.name: v.loop_var for v in _all_loops(out)}

    def at(j, kb, s, k):
        values = {"j": j, "kb": kb, "s": s, "k": k}
        bound = tvm_ffi.structural_map(
            index, [(tirx.Var, lambda v: tirx.const(values[v.name], "int32") if v.name in values else v)])
        return int(Analyzer().simplify(bound).value)

    assert set(loops) >= {"j", "kb", "s", "k"}
    # B[j * 1024 + kb * 512 + k * 32 + lane]: a row of 32 floats is 2 lines; step
    # t = s * 16 + k of the 2 strips x 16 steps fetches line t of the 32: row t // 2, line t % 2
    assert at(0, 0, 0, 3) == 1024 + 1 * 32 + 16  # the next panel
    assert at(0, 0, 1, 3) == 1024 + 9 * 32 + 16
    assert at(1, 0, 0, 4) == 512 + 2 * 32  # after the last panel: the next K block's first
    assert at(1, 1, 1, 15) == 512 + 15 * 32 + 16  # the last K block's last panel: its first panel's
    # every line of the next panel's K block, once
    lines = sorted(at(0, 1, s, k) for s in range(2) for k in range(16))
    assert lines == [1024 + 512 + row * 32 + half * 16 for row in range(16) for half in range(2)]
    tiles = []
    tvm_ffi.structural_walk(
        out.body, [(tirx.AllocBuffer, lambda a: tiles.append(a) if a.buffer.name == "acc_tile" else None)])
    (tile,) = tiles
    assert tile.buffer.scope() == "local" and [int(x) for x in tile.buffer.shape] == [2]
    assert bool(tile.annotations[DISABLE_LOWER_BUILTIN])


@pytest.mark.parametrize("func", [param_acc, overlapping, moving_index, not_a_sum],
                         ids=["parameter", "overlapping", "moving", "not-a-sum"])
def test_leaves_unproven_tiles_alone(func):
    tvm.ir.assert_structural_equal(prefetch_next_panel(func), func)


def test_lowered_nest_computes_the_same(tmp_path):
    """The rewritten hand-written nest against the original, built and run."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal(64).astype("float32")
    b = rng.standard_normal(2048).astype("float32")
    results = []
    for func in (nest, prefetch_next_panel(nest)):
        lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm")
        c = tvm.runtime.tensor(np.zeros(128, "float32"))
        lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
        results.append(c.numpy())
    assert np.abs(results[0]).max() > 0
    np.testing.assert_array_equal(results[1], results[0])


def test_blocked_sums_start_each_k_block_at_zero():
    """A K loop marked ``K_SUMS`` (no prefetch mark): the tile starts at +0, the block's sum
    is added to the accumulator after the loop, and nothing is prefetched; built and run,
    each output is the sum of every block's products (numpy)."""
    out = prefetch_next_panel(blocked)
    (k_loop,) = _k_loops(out)
    assert _buffers(k_loop.body) == {"acc_tile"} and K_SUMS not in k_loop.annotations
    calls = []
    tvm_ffi.structural_walk(out.body, [(tvm.ir.Call, lambda c: calls.append(c.op.name))])
    assert "tirx.prefetch" not in calls
    text = out.script()
    assert "acc_tile[0] = T.Broadcast(T.float32(0.0), 16)" in text
    assert "acc[j * 2] = acc[j * 2] + acc_tile[0]" in text

    # small integers: every product and sum is exact, so the result is the exact sum
    # whatever the order: the blocks are all counted, once (the order is checked above)
    rng = np.random.default_rng(1)
    a = rng.integers(-8, 9, 64).astype("float32")
    b = rng.integers(-8, 9, 2048).astype("float32")
    lib = tvm.compile(tvm.IRModule({"main": out.with_attr("global_symbol", "main")}), target="llvm")
    c = tvm.runtime.tensor(np.zeros(64, "float32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
    rows = np.stack([b[j * 1024 + kb * 256 + k * 16:][:16] for j in range(2) for kb in range(4) for k in range(16)])
    rows = rows.reshape(2, 64, 16).astype(np.float64)
    want = np.stack([a @ rows[j] * scale for j in range(2) for scale in (1.0, 0.5)])
    assert np.abs(want).max() > 0
    np.testing.assert_array_equal(c.numpy().reshape(4, 16), want)


def test_gemm_sums_k_blocks_from_zero():
    """A K of 4096 in blocks: each row is 2^24 (first) then 4095 ones. One serial float32
    sum loses every 1 (2^24 + 1 rounds back to 2^24); summed block by block from zero only
    the first block's ones are lost.  Against numpy's float64 sum."""
    k = 4096
    model = torch.nn.Linear(k, 64).eval()
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(np.tile(np.float32([1.0, 2.0, 0.5, 4.0]), (64, k // 4))))
        model.bias.zero_()
    x = np.ones((16, k), "float32") * np.float32(2.0) ** (np.arange(16, dtype="float32")[:, None] % 3)
    x[:, 0] = np.float32(2.0**24) * x[:, 1]
    want = x.astype(np.float64) @ model.weight.detach().numpy().astype(np.float64).T
    mod = aicf_tvm.from_torch(model, (torch.from_numpy(x),))
    blocked_out = np.asarray(aicf_tvm.compile(mod, target="llvm", cache=False)(x))
    serial = aicf_tvm.CompileOptions(blocked_sums=False)
    serial_out = np.asarray(aicf_tvm.compile(mod, target="llvm", options=serial, cache=False)(x))
    serial_err, blocked_err = (np.abs(y - want) / np.abs(want) for y in (serial_out, blocked_out))
    assert serial_err.max() > 3e-5  # most of the 4095 ones lost
    assert blocked_err.max() < serial_err.max() / 4  # the ones of later blocks kept


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(512, 640), torch.nn.GELU(), torch.nn.Linear(640, 256)).eval()


def _prefetches(compiled) -> int:
    ll = "".join(m.inspect_source("ll") for m in compiled.executable.mod.imports if m.kind == "llvm")
    return ll.count("call void @llvm.prefetch")


def test_linear_layers_prefetch_and_match():
    model = _mlp()
    x = torch.randn(1, 96, 512)
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(model, (x,)), target="llvm")
    assert _prefetches(compiled) >= 2  # both GEMMs (K 512 and 640: two K blocks each)
    with torch.no_grad():
        want = [model(v).numpy() for v in (x, torch.randn(1, 96, 512))]
    got = np.asarray(compiled(x.numpy()))
    assert not np.allclose(want[0], want[1])  # the output depends on the input
    np.testing.assert_allclose(got, want[0], rtol=1e-4, atol=1e-4 * np.abs(want[0]).max())

    no_marks = aicf_tvm.CompileOptions(gemm_prefetch_b_panels=False)  # no marks: no rewrite
    plain = aicf_tvm.compile(aicf_tvm.from_torch(model, (x,)), target="llvm", options=no_marks)
    assert _prefetches(plain) == 0
    np.testing.assert_array_equal(np.asarray(plain(x.numpy())), got)  # the same bits


def test_avx2_tiles_prefetch_only_panels_one_row_block_reads():
    """With 16 registers (AVX2) a nest prefetches only where one block of rows reads each
    panel per K block (a static M of one ``mc`` block, or a symbolic M); with 32 always."""
    from schedules.cpu.gemm_plan import plan_gemm
    from schedules.cpu.gemm_prefetch import prefetch_pays

    for m, blocks in ((96, 1), (197, 3), (128, 2), (1500, 25), (None, None)):
        avx2 = plan_gemm(1, m, 3072, 768, lanes=8, cores=2, registers=16, b_constant=True)
        if m is not None:
            assert avx2.m_padded // avx2.mc == blocks, avx2
        assert prefetch_pays(avx2, 16) == (blocks in (1, None))
        assert prefetch_pays(plan_gemm(1, m, 3072, 768, lanes=16, cores=2, registers=32, b_constant=True), 32)
