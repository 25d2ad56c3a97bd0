"""What ``VectorizeMath`` gains: ``python -m scripts.bench_transcendental [--rounds 5]``.

Two tables, every variant timed in the same process, interleaved round by round (the
machine is shared: compare the ratios, not the milliseconds):

* the encoder FFN GEMM [128 x 768] @ [768 x 3072] + bias, compiled by our pipeline,
  alone and with a GELU epilogue (erf form and tanh form), with libm calls (``run_pipeline(...,
  vector_math=False)``) and with ``VectorizeMath``: the epilogue's cost is the ratio to the
  GEMM alone;
* each float32 function on 2^20 elements: TVM's lowering (the scalar loop our Elementwise
  rule built before, one libm call per element) against the vectorized expansion.
"""

from __future__ import annotations

import argparse

import numpy as np
import tvm
from tvm import relax, te, tirx

from aicf_tvm.driver.pipeline import run_pipeline
from aicf_tvm.runtime.targets import resolve_target
from aicf_tvm.runtime.threads import thread_count, use_threads
from schedules.cpu.common import try_parallel
from schedules.cpu.vector_math import vectorize_math

FUNCTIONS = ("exp", "erf", "tanh", "sigmoid", "log")


def ffn_module(activation: str | None, rng: np.random.Generator) -> tvm.IRModule:
    """act(x @ w + b) with constant w, b: the encoder layer's first FFN GEMM."""
    x = relax.Var("x", relax.TensorType((1, 128, 768), "float32"))
    w = relax.const(rng.standard_normal((768, 3072)).astype("float32") * 0.03)
    b = relax.const(rng.standard_normal(3072).astype("float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, w)), b))
            if activation is not None:
                y = bb.emit(getattr(relax.op.nn, activation)(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def gemm_kernel(mod: tvm.IRModule, target: tvm.target.Target, vector_math: bool) -> tirx.PrimFunc:
    """The module's one fused GEMM PrimFunc, lowered and scheduled by our pipeline."""
    lowered = run_pipeline(mod, target, until="schedule", vector_math=vector_math).lowered
    kernels = [f for f in lowered.functions.values()
               if isinstance(f, tirx.PrimFunc) and f.attrs is not None
               and str(f.attrs.get("aicf.kind", "")) == "fused_gemm_bias_act"]
    if len(kernels) != 1:
        raise SystemExit(f"expected one fused_gemm_bias_act kernel, found {len(kernels)}")
    return kernels[0]


def unary_kernel(name: str, n: int, target: tvm.target.Target, vector_math: bool) -> tirx.PrimFunc:
    """y = f(x) on n floats: parallel chunks, vectorized when ``vector_math``."""
    a = te.placeholder((n,), "float32", name="a")
    out = te.compute((n,), lambda i: getattr(tirx, name)(a[i]), name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, out]))
    (loop,) = sch.get_loops(sch.get_sblock("y"))
    outer, inner = sch.split(loop, [None, 16])
    try_parallel(sch, outer)
    if vector_math:
        sch.vectorize(inner)
        return vectorize_math(sch.mod["main"])
    return sch.mod["main"]


def timer(func: tirx.PrimFunc, target: tvm.target.Target, rng: np.random.Generator):
    """A callable returning one timing (seconds per call) of ``func`` on random arguments."""
    func = func.with_attr("global_symbol", "kernel")
    lib = tvm.compile(tvm.IRModule({"kernel": func}), target=target)
    args = []
    for p in func.params:
        shape = [int(d) for d in p.ty.shape]
        args.append(tvm.runtime.tensor((rng.standard_normal(shape) * 4).astype(str(p.ty.dtype))))
    evaluate = lib.mod.time_evaluator("kernel", tvm.cpu(), number=5, repeat=1, min_repeat_ms=20)
    return lambda: float(evaluate(*args).mean)


def interleaved(timers: dict[str, object], rounds: int) -> dict[str, float]:
    """Median seconds per variant, the variants run one after another in every round."""
    samples: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(rounds):
        for name, run in timers.items():
            samples[name].append(run())
    return {name: float(np.median(s)) for name, s in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--target", default="llvm")
    args = parser.parse_args()
    target = resolve_target(args.target)
    use_threads(thread_count(None, target.export()))  # what a compiled model runs with
    rng = np.random.default_rng(0)
    print(f"target: {target}")

    gemm = {"gemm": timer(gemm_kernel(ffn_module(None, rng), target, True), target, rng)}
    for act in ("gelu", "gelu_tanh"):
        mod = ffn_module(act, rng)
        for vec in (False, True):
            label = f"gemm+{act} {'vector' if vec else 'libm'}"
            gemm[label] = timer(gemm_kernel(mod, target, vec), target, rng)
    times = interleaved(gemm, args.rounds)
    print(f"\n{'kernel':28s} {'ms':>8s} {'x gemm':>7s}")
    for name, secs in times.items():
        print(f"{name:28s} {secs * 1e3:8.3f} {secs / times['gemm']:7.2f}")

    n = 1 << 20
    print(f"\n{'function':10s} {'libm ms':>8s} {'vector ms':>9s} {'speedup':>8s}   ({n} float32)")
    timers = {}
    for name in FUNCTIONS:
        for vec in (False, True):
            timers[(name, vec)] = timer(unary_kernel(name, n, target, vec), target, rng)
    times = interleaved(timers, args.rounds)
    for name in FUNCTIONS:
        libm, vec = times[(name, False)], times[(name, True)]
        print(f"{name:10s} {libm * 1e3:8.3f} {vec * 1e3:9.3f} {libm / vec:7.1f}x")


if __name__ == "__main__":
    main()
