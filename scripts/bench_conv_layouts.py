"""NCHW against blocked (NCHW16c) convolutions on ResNet-50, MobileNetV2 and RegNet /
ResNeXt (grouped) layers: the measurements behind ``relax_passes.materialize_layouts.RATES``.

Run: python -m scripts.bench_conv_layouts [--threads 1] [--kinds grouped ...]

Each layer is conv + bias + ReLU built from Relax, fused into one PrimFunc, scheduled by
the default rules (Conv2d / Depthwise for NCHW, BlockedConv2d blocked), checked against
PyTorch and timed (min over repeats). Printed per layer: GFLOP/s of both and the ratio;
then the median GFLOP/s per layer class, the numbers the cost table holds (one thread).
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch
import tvm
from tvm import relax

from aicf_tvm.runtime.targets import resolve_target
from aicf_tvm.runtime.threads import use_threads
from relax_passes.legalize_blocked_conv import LEGALIZE_MAP
from relax_passes.materialize_layouts import blocked_per_channel, blocked_weight, channel_block
from schedules import default_rules, schedule_func
from schedules.cpu.common import float32_lanes

# (in channels, size, out channels, kernel, stride, padding, groups)
LAYERS = [
    (3, 224, 64, 7, 2, 3, 1), (64, 56, 64, 3, 1, 1, 1), (64, 56, 256, 1, 1, 0, 1), (256, 56, 64, 1, 1, 0, 1),
    (128, 56, 128, 3, 2, 1, 1), (256, 56, 512, 1, 2, 0, 1), (256, 14, 256, 3, 1, 1, 1), (512, 7, 512, 3, 1, 1, 1),
    (512, 7, 2048, 1, 1, 0, 1), (1024, 14, 256, 1, 1, 0, 1), (3, 224, 32, 3, 2, 1, 1), (32, 112, 32, 3, 1, 1, 32),
    (16, 112, 96, 1, 1, 0, 1), (96, 112, 96, 3, 2, 1, 96), (144, 56, 144, 3, 1, 1, 144), (144, 56, 24, 1, 1, 0, 1),
    (24, 56, 144, 1, 1, 0, 1), (576, 14, 576, 3, 1, 1, 576), (960, 7, 160, 1, 1, 0, 1), (96, 56, 96, 7, 1, 3, 96),
    # grouped: RegNetY-4GF (group width 64) and ResNeXt-50 32x4d's wider stages (width 16)
    (128, 56, 128, 3, 1, 1, 2), (192, 28, 192, 3, 1, 1, 3), (512, 28, 512, 3, 2, 1, 8), (512, 14, 512, 3, 1, 1, 8),
    (1088, 7, 1088, 3, 1, 1, 17), (512, 14, 512, 3, 1, 1, 32), (1024, 7, 1024, 3, 1, 1, 32),
]


def kernel(params: list[tuple], build, legalize=None) -> tvm.tirx.PrimFunc:
    """The one PrimFunc of ``build`` over float32 params, fused and scheduled."""
    bb = relax.BlockBuilder()
    vs = [relax.Var(f"p{i}", relax.TensorType(s, "float32")) for i, s in enumerate(params)]
    with bb.function("main", vs):
        with bb.dataflow():
            out = bb.emit_output(build(bb, *vs))
        bb.emit_func_output(out)
    mod = bb.get()
    for t in (relax.transform.LegalizeOps(legalize), relax.transform.AnnotateTIROpPattern(),
              relax.transform.FuseOps(), relax.transform.FuseTIR()):
        mod = t(mod)
    [func] = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    return schedule_func(func, TARGET, default_rules(TARGET))


def seconds(func: tvm.tirx.PrimFunc, arrays: list[np.ndarray], out_shape) -> tuple[float, np.ndarray]:
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=TARGET)
    args = [tvm.runtime.tensor(a) for a in arrays] + [tvm.runtime.tensor(np.zeros(out_shape, "float32"))]
    timer = lib.jit().time_evaluator("main", tvm.cpu(), number=10, repeat=7, min_repeat_ms=10)
    return min(timer(*args).results), args[-1].numpy()


def to_blocked(a: np.ndarray, b: int) -> np.ndarray:
    n, c, h, w = a.shape
    return np.ascontiguousarray(a.reshape(n, c // b, b, h, w).transpose(0, 1, 3, 4, 2))


def layer_kind(c, h, o, k, s, p, g, lanes: int) -> str:
    """The RATES class of a layer, as ``materialize_layouts.layout_form`` names it."""
    if g > 1:
        return "depthwise" if g == c else "grouped"
    return "plain_input" if channel_block(c, lanes) is None else "1x1" if k == 1 else "dense"


def layer(c, h, o, k, s, p, g, lanes: int) -> tuple[str, float, float]:
    """(class, NCHW GFLOP/s, blocked GFLOP/s) of one layer, both checked against torch."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, c, h, h)).astype("float32")
    w = rng.standard_normal((o, c // g, k, k)).astype("float32")
    b = rng.standard_normal((1, o, 1, 1)).astype("float32")
    want = torch.relu(torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=s, padding=p,
                                                 groups=g) + torch.from_numpy(b)).numpy()
    ib, ob = channel_block(c, lanes), channel_block(o, lanes)
    kind = layer_kind(c, h, o, k, s, p, g, lanes)
    kb = 1 if kind in ("depthwise", "plain_input") else ib

    def conv(layouts):
        return lambda bb, xv, wv, bv: relax.op.nn.relu(bb.emit(relax.op.add(bb.emit(
            relax.op.nn.conv2d(xv, wv, strides=s, padding=p, groups=g, **layouts)), bv)))

    plain = kernel([x.shape, w.shape, b.shape], conv({}))
    t_plain, got = seconds(plain, [x, w, b], want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
    arrays = [x if ib is None or kind == "plain_input" else to_blocked(x, ib), blocked_weight(w, kb, ob),
              blocked_per_channel(b, ob)]
    layouts = {"data_layout": "NCHW" if kind == "plain_input" else f"NCHW{ib}c",
               "kernel_layout": f"OIHW{kb}i{ob}o", "out_layout": f"NCHW{ob}c"}
    fast = kernel([a.shape for a in arrays], conv(layouts), LEGALIZE_MAP)
    t_fast, got = seconds(fast, arrays, to_blocked(want, ob).shape)
    np.testing.assert_allclose(got, to_blocked(want, ob), rtol=1e-3, atol=1e-3)
    gflop = 2 * o * (c // g) * k * k * want.shape[2] * want.shape[3] / 1e9
    return kind, gflop / t_plain, gflop / t_fast


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kinds", nargs="*", help="only these layer classes (dense, 1x1, grouped, ...)")
    args = parser.parse_args()
    use_threads(args.threads)
    lanes = float32_lanes(TARGET)
    by_kind: dict[str, list[tuple[float, float]]] = {}
    for shape in LAYERS:
        if args.kinds and layer_kind(*shape, lanes) not in args.kinds:
            continue
        kind, plain, fast = layer(*shape, lanes)
        by_kind.setdefault(kind, []).append((plain, fast))
        print(f"C{shape[0]:<5} {shape[1]:>3}x{shape[1]:<3} O{shape[2]:<5} k{shape[3]} s{shape[4]} g{shape[6]:<4} "
              f"{kind:12s} NCHW {plain:6.1f}  blocked {fast:6.1f} GFLOP/s  x{fast / plain:.2f}", flush=True)
    for kind, rows in by_kind.items():
        print(f"median {kind:12s} NCHW {statistics.median(r[0] for r in rows):6.1f}  "
              f"blocked {statistics.median(r[1] for r in rows):6.1f} GFLOP/s")


TARGET = resolve_target("llvm")

if __name__ == "__main__":
    main()
