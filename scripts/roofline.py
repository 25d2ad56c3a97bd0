"""GFLOP/s of our fused GEMM (matmul + bias + relu, CPU ``Gemm`` rule) against numpy.

Usage: ``python -m scripts.roofline [--sizes 512 1024 2048] [--threads N]``

Both run in this process, interleaved, each timed as the best of several repeats, so a
neighbour stealing a core hurts both alike; the ratio is the number to watch (goal >= 0.75
from 512^3 up). ``OPENBLAS_CORETYPE`` / ``OPENBLAS_L2_SIZE`` are removed before numpy is
imported: set to another CPU's values they make OpenBLAS pick slow kernels. Both get
``--threads`` threads (default: every CPU this process may use).
"""

from __future__ import annotations

import argparse
import functools
import os
import time


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--repeats", type=int, default=10)
    return parser.parse_args()


# Settled before numpy (OpenBLAS) reads the environment; TVM's pool is sized in main().
ARGS = parse_args()
for _name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
    os.environ.pop(_name, None)
os.environ["OPENBLAS_NUM_THREADS"] = str(ARGS.threads)

import numpy as np
import tvm
from tvm import relax

from aicf_tvm.runtime.threads import use_threads
from schedules.cpu.gemm import Gemm


def host_target(threads: int) -> tvm.target.Target:
    config = dict(tvm.target.Target.from_device(tvm.cpu()).export())
    config["num-cores"] = threads
    return tvm.target.Target(config)


def fused_gemm(n: int) -> tvm.tirx.PrimFunc:
    """The PrimFunc Relax makes of relu(x @ w + b), x, w: [n, n]."""
    ty = relax.TensorType
    x, w = relax.Var("x", ty((n, n), "float32")), relax.Var("w", ty((n, n), "float32"))
    b = relax.Var("b", ty((n,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w))
            y = bb.emit(relax.op.add(y, b))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    mod = bb.get()
    for transform in (
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ):
        mod = transform(mod)
    (func,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    return func


def best_seconds(run, repeats: int) -> float:
    run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    args = ARGS
    target = host_target(args.threads)
    use_threads(args.threads)
    print(f"target: {target}, {args.threads} threads")
    rng = np.random.default_rng(0)
    for n in args.sizes:
        sch = Gemm().apply(fused_gemm(n), target, False)
        if sch is None:
            raise SystemExit(f"Gemm rule did not apply to the {n}^3 fused GEMM")
        func = sch.mod["main"].with_attr("global_symbol", "main")
        kernel = tvm.compile(tvm.IRModule({"main": func}), target=target).mod["main"]
        x, w = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
        b = rng.standard_normal(n, dtype=np.float32)
        out = tvm.runtime.tensor(np.empty((n, n), np.float32))
        tensors = [tvm.runtime.tensor(a) for a in (x, w, b)]
        kernel(*tensors, out)
        expected = np.maximum(x @ w + b, 0)
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-3, atol=1e-3 * np.sqrt(n))
        flops = 2.0 * n**3
        ours, ref = float("inf"), float("inf")
        run_ours = functools.partial(kernel, *tensors, out)
        run_numpy = functools.partial(np.matmul, x, w)
        for _ in range(3):  # interleave so both see the same machine load
            ours = min(ours, best_seconds(run_ours, args.repeats))
            ref = min(ref, best_seconds(run_numpy, args.repeats))
        ours_gf, ref_gf = flops / ours / 1e9, flops / ref / 1e9
        print(
            f"{n}^3: ours {ours_gf:7.1f} GFLOP/s  numpy {ref_gf:7.1f} GFLOP/s"
            f"  ratio {ours_gf / ref_gf:.2f}"
        )


if __name__ == "__main__":
    main()
