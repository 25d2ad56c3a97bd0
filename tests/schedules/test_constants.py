"""Blocks that store an immediate: never inlined on CPU, made opaque for dlight's GPU rules."""

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
from tvm import tirx
from tvm.script import tirx as T

from schedules.constants import opaque_constant_stores, opaque_immediate

ROOT = Path(__file__).resolve().parents[2]


@T.prim_func(s_tir=True)
def zero_then_sum(x: T.Buffer((8,), "float32"), y: T.Buffer((8,), "float32"), s: T.Buffer((1,), "float32")):
    t = T.sblock_alloc_buffer((8,))
    for i in range(8):
        with T.sblock("zero"):
            v = T.axis.spatial(8, i)
            t[v] = T.float32(0.0)
    for i in range(8):
        with T.sblock("add"):
            v = T.axis.spatial(8, i)
            y[v] = x[v] + t[v]
    for i in range(8):
        with T.sblock("sum"):
            k = T.axis.reduce(8, i)
            with T.init():
                s[0] = T.float32(0.0)
            s[0] = s[0] + y[k]


def test_constant_store_is_hidden_and_reduction_init_kept():
    script = opaque_constant_stores(zero_then_sum).script()
    assert 'T.reinterpret("float32", T.uint32(0))' in script
    assert "s[0] = T.float32(0.0)" in script  # the reducer's identity stays visible


def test_opaque_immediates_keep_the_bits():
    for dtype, value, fmt in [("float32", -0.0, "<f"), ("float16", 1.5, "<e"), ("float64", float("inf"), "<d")]:
        opaque = opaque_immediate(tirx.const(value, dtype))
        assert int(opaque.args[0].value) & ((1 << 8 * struct.calcsize(fmt)) - 1) == \
            int.from_bytes(struct.pack(fmt, value), "little")
    assert str(opaque_immediate(tirx.const(255, "uint8")).args[0]) == "T.int8(-1)"
    assert opaque_immediate(tirx.const(True, "bool")) is None


CONSTANT_BLOCKS = '''
import sys
import numpy as np
import tvm
from tvm.script import tirx as T
from tvm.target import Target
from schedules import default_rules, schedule_func


@T.prim_func(s_tir=True)
def main(x: T.Buffer((64,), "float32"), a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
    T.func_attr({"global_symbol": "main", "tirx.noalias": True})
    t = T.sblock_alloc_buffer((64,))
    for i in range(64):
        with T.sblock("zero"):
            v = T.axis.spatial(64, i)
            t[v] = T.float32(0.0)
    for i in range(64):
        with T.sblock("reciprocal"):
            v = T.axis.spatial(64, i)
            a[v] = T.float32(1.0) / t[v]
    for i in range(64):
        with T.sblock("shifted_reciprocal"):
            v = T.axis.spatial(64, i)
            b[v] = T.float32(1.0) / (x[v] + t[v])


cuda = Target({"kind": "cuda", "arch": "sm_90"})
on_gpu = schedule_func(main, cuda, default_rules(cuda))
assert on_gpu is not None and "T.float32(0.0)" not in on_gpu.script()
tvm.compile(on_gpu, target=cuda)
cpu = Target({"kind": "llvm", "num-cores": 2})
scheduled = schedule_func(main, cpu, default_rules(cpu))
assert str(scheduled.attrs["aicf.schedule"]) == "Elementwise", scheduled.attrs["aicf.schedule"]
f = tvm.compile(scheduled, target=cpu)
x = np.load(sys.argv[1])
out = [tvm.runtime.tensor(np.empty(64, "float32")) for _ in range(2)]
f(tvm.runtime.tensor(x), *out)
np.savez(sys.argv[2], *[o.numpy() for o in out])
'''


def test_inlining_a_constant_block_neither_folds_nor_aborts(tmp_path):
    """A block storing 0.0 inlined into 1 / _ used to abort the process (dlight's
    try_inline kept going on a schedule a failed fold had left half-rewritten), and
    x + 0.0 would fold to x. Scheduled (and built) for CUDA and CPU in a subprocess; the
    CPU kernel matches numpy on ±0, ±inf and NaN."""
    script, inputs, outputs = tmp_path / "constant_blocks.py", tmp_path / "x.npy", tmp_path / "out.npz"
    script.write_text(CONSTANT_BLOCKS)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], "float32")
    x = np.concatenate([special, np.random.default_rng(0).standard_normal(59).astype("float32")])
    np.save(inputs, x)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, str(script), str(inputs), str(outputs)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    got = np.load(outputs)
    zero, one = np.float32(0.0), np.float32(1.0)
    with np.errstate(all="ignore"):
        want = [np.full(64, one / zero), one / (x + zero)]
    for k, w in enumerate(want):
        np.testing.assert_array_equal(got[f"arr_{k}"], w)
        number = ~np.isnan(w)
        np.testing.assert_array_equal(np.signbit(got[f"arr_{k}"][number]), np.signbit(w[number]))
