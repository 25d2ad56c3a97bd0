"""Speed sanity check of the default CPU schedules against the unscheduled PrimFuncs.

Run: python -m scripts.bench_schedules   (prints one line per kernel: ms and the ratio)
"""

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.relax.backend.cpu_generic import pipeline as cpu_pipeline
from tvm.script import relax as R
from tvm.target import Target

from schedules import apply_default_schedules

TARGET = Target({**Target.from_device(tvm.cpu()).export(), "num-cores": 2})


def relax_module(shapes: list[tuple], body: Callable) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    params = [relax.Var(f"p{i}", R.Tensor(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(*params))
        bb.emit_func_output(out)
    return bb.get()


def time_ms(mod: tvm.IRModule, shapes: list[tuple], schedule: bool) -> float:
    """Median ms of ``main`` built by the CPU pipeline, with or without our schedules."""
    passes = [
        *cpu_pipeline.legalize_passes(TARGET),
        *([apply_default_schedules(TARGET)] if schedule else []),
        *cpu_pipeline.dataflow_lower_passes(TARGET),
        *cpu_pipeline.finalize_passes(TARGET),
    ]
    with TARGET:
        ex = tvm.compile(tvm.transform.Sequential(passes)(mod), target=TARGET)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal(s).astype("float32")) for s in shapes]
    timer = vm.time_evaluator("main", tvm.cpu(), number=10, repeat=5, min_repeat_ms=50)
    return float(np.median(timer(*args).results)) * 1e3


CASES = {
    "softmax 512x1024": ([(512, 1024)], lambda x: relax.op.nn.softmax(x)),
    "layer_norm 1024x768": (
        [(1024, 768), (768,), (768,)],
        lambda x, g, b: relax.op.nn.layer_norm(x, g, b, axes=[-1]),
    ),
    "rms_norm 1024x768": (
        [(1024, 768), (768,)],
        lambda x, g: relax.op.nn.rms_norm(x, g, axes=[-1]),
    ),
    "max_pool 3x3/2 1x64x112x112": (
        [(1, 64, 112, 112)],
        lambda x: relax.op.nn.max_pool2d(x, (3, 3), (2, 2), (1, 1)),
    ),
    "gelu(add) 1024x3072": (
        [(1024, 3072), (3072,)],
        lambda x, b: relax.op.nn.gelu(relax.op.add(x, b)),
    ),
}


def main() -> None:
    for name, (shapes, body) in CASES.items():
        mod = relax_module(shapes, body)
        base, ours = time_ms(mod, shapes, False), time_ms(mod, shapes, True)
        print(
            f"{name:30s} unscheduled {base:8.3f} ms  scheduled {ours:8.3f} ms  x{base / ours:5.1f}"
        )


if __name__ == "__main__":
    main()
