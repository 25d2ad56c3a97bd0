"""Time LiftEmits + PropagateContracts against TVM's FuseOps on synthetic Emit graphs.

    python -m scripts.bench_passes [--sizes 1000 10000 50000]

Each graph is a DAG of matmul, add, relu, multiply, reshape, permute_dims and softmax
calls over a few shapes, wired to earlier values at random (seeded). FuseOps runs on
the same graph after LegalizeOps + AnnotateTIROpPattern (not timed), which is what it
needs. Prints seconds, Emits per second, and the ratio ours / FuseOps.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import tvm
from tvm import relax

from relax_passes import LiftEmits, PropagateContracts


def synthetic_graph(n: int, seed: int = 0) -> tvm.IRModule:
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((32, 64), "float32"))
    w = relax.Var("w", relax.TensorType((64, 64), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            pool = [x]
            for i in range(n):
                a = pool[-1]  # a chain keeps every value live
                b = pool[int(rng.integers(max(0, len(pool) - 16), len(pool)))]
                k = i % 8
                if k == 0:
                    v = relax.op.matmul(a, w)
                elif k == 1:
                    v = relax.op.add(a, b)
                elif k == 2:
                    v = relax.op.nn.relu(a)
                elif k == 3:
                    v = relax.op.multiply(a, b)
                elif k == 4:
                    v = relax.op.reshape(a, (32, 64))
                elif k == 5:
                    v = relax.op.nn.silu(a)
                elif k == 6:
                    v = relax.op.nn.softmax(a, axis=-1)
                else:
                    v = relax.op.subtract(a, b)
                pool.append(bb.emit(v))
            out = bb.emit_output(pool[-1])
        bb.emit_func_output(out)
    return bb.get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 50000])
    args = parser.parse_args()
    print(f"{'emits':>7} {'lift s':>8} {'propagate s':>12} {'ours s':>8} {'FuseOps s':>10} "
          f"{'ours/FuseOps':>13} {'us/emit':>8}")
    for n in args.sizes:
        mod = synthetic_graph(n)
        t0 = time.perf_counter()
        lifted = LiftEmits()(mod)
        t1 = time.perf_counter()
        PropagateContracts()(lifted)
        t2 = time.perf_counter()
        legal = tvm.transform.Sequential(
            [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern()])(mod)
        t3 = time.perf_counter()
        relax.transform.FuseOps()(legal)
        t4 = time.perf_counter()
        ours, theirs = t2 - t0, t4 - t3
        print(f"{n:>7} {t1 - t0:>8.2f} {t2 - t1:>12.2f} {ours:>8.2f} {theirs:>10.2f} {ours / theirs:>13.2f} "
              f"{ours / n * 1e6:>8.1f}")


if __name__ == "__main__":
    main()
