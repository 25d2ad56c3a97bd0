"""CUDA rule set: every PrimFunc of typical models gets a thread-bound schedule and
``tvm.compile`` emits CUDA kernels.  Compile only: this machine has nvcc but no GPU."""

import shutil
from collections.abc import Callable

import pytest
import tvm
from tvm import relax, s_tir, tirx
from tvm.relax.dpl import is_op, wildcard
from tvm.script import relax as R
from tvm.target import Target

from schedules import apply_default_schedules, is_scheduled
from schedules.cuda import RequireThreadBinding, unbound_blocks
from tests import helpers

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")

CUDA = Target({"kind": "cuda", "arch": "sm_90"})


def relax_module(shapes: list[tuple], body: Callable, fuse_pattern=None) -> tvm.IRModule:
    """A legalized, fused module whose ``main`` computes ``body(*params)``."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"p{i}", R.Tensor(shape, "float32")) for i, shape in enumerate(shapes)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(*params))
        bb.emit_func_output(out)
    mod = bb.get()
    passes = [relax.transform.LegalizeOps()]
    if fuse_pattern is not None:
        mod = relax.transform.FuseOpsByPattern(
            [("fused", fuse_pattern)], bind_constants=False, annotate_codegen=False
        )(mod)
    else:
        passes += [relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps()]
    passes += [relax.transform.FuseTIR(), relax.transform.DeadCodeElimination()]
    return tvm.transform.Sequential(passes)(mod)


def cuda_source(mod: tvm.IRModule) -> str:
    """Schedule with the pass, compile for CUDA, and return the device source."""
    mod = apply_default_schedules(CUDA)(mod)
    funcs = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    assert funcs and all(is_scheduled(f) for f in funcs)
    source = helpers.cuda_source(tvm.compile(mod, target=CUDA))
    assert source is not None, "no CUDA module in the build"
    return source


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

CASES = {
    "softmax": ([(2, 4, 8, 64)], lambda p: relax.op.nn.softmax(p)),
    "softmax_axis1": ([(2, 16, 8, 16)], lambda p: relax.op.nn.softmax(p, axis=1)),
    "layer_norm": (
        [(4, 16, 64), (64,), (64,)],
        lambda p, g, b: relax.op.nn.layer_norm(p, g, b, axes=[-1]),
    ),
    "rms_norm": ([(4, 16, 64), (64,)], lambda p, g: relax.op.nn.rms_norm(p, g, axes=[-1])),
    "matmul": ([(64, 32), (32, 48)], relax.op.matmul),
    "batch_matmul_relu": (
        [(2, 64, 32), (2, 32, 48)],
        lambda a, b: relax.op.nn.relu(relax.op.matmul(a, b)),
    ),
    "conv2d_relu": (
        [(1, 8, 16, 16), (16, 8, 3, 3)],
        lambda x, w: relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=1)),
    ),
    "max_pool": ([(2, 8, 16, 16)], lambda p: relax.op.nn.max_pool2d(p, (3, 3), (2, 2), (1, 1))),
    "global_avg_pool": ([(2, 32, 7, 7)], lambda p: relax.op.nn.adaptive_avg_pool2d(p, (1, 1))),
    "mean": ([(2, 8, 8, 16)], lambda p: relax.op.mean(p, axis=[2, 3])),
    "elementwise": (
        [(8, 64, 32), (8, 64, 32)],
        lambda a, b: relax.op.nn.gelu(relax.op.add(a, b)),
    ),
    "transpose_reshape": (
        [(4, 32, 64)],
        lambda a: relax.op.reshape(relax.op.permute_dims(a, [0, 2, 1]), (4, 2048)),
    ),
    "concat": ([(4, 16, 64), (4, 8, 64)], lambda a, b: relax.op.concat([a, b], axis=1)),
}


@pytest.mark.parametrize("name", CASES)
def test_op_compiles_to_cuda_kernels(name: str):
    shapes, body = CASES[name]
    assert "__global__" in cuda_source(relax_module(shapes, body))


def test_fused_attention_compiles_to_cuda_kernels():
    shapes = [(1, 2, 32, 16)] * 3 + [(1, 2, 32, 32)]
    mod = relax_module(shapes, attention, ATTENTION)
    assert len([f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]) == 1
    assert "__global__" in cuda_source(mod)


def test_small_cnn_compiles_end_to_end():
    def cnn(x, w, d):
        y = relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=1))
        y = relax.op.nn.adaptive_avg_pool2d(relax.op.nn.max_pool2d(y, (2, 2), (2, 2)), (1, 1))
        return relax.op.nn.softmax(relax.op.matmul(relax.op.reshape(y, (1, 8)), d))

    mod = relax_module([(1, 4, 16, 16), (8, 4, 3, 3), (8, 10)], cnn)
    assert cuda_source(mod).count("__global__") >= 4


def test_schedule_leaving_a_block_unbound_is_not_applicable():
    """A rule that returns its input untouched leaves every block on the host."""

    class Identity(s_tir.dlight.base.ScheduleRule):
        def apply(self, func, target, tunable):
            return s_tir.Schedule(func)

    mod = relax_module([(8, 64)], lambda p: relax.op.exp(p))
    func = next(f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc))
    assert unbound_blocks(s_tir.Schedule(func))
    assert RequireThreadBinding(Identity()).apply(func, CUDA, False) is None
