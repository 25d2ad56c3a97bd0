"""One Adam step of a 10-million-parameter MLP: ours vs TVM's default pipeline vs PyTorch.

Prints, per implementation, kernels launched per step, extra storage allocated per step
(beyond P, M, V, G) and the median step time, then the ratios to ours.

    python -m scripts.bench_optimizer [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import tvm
from tvm import relax

import aicf_tvm
from aicf_tvm.driver.optimizer import adam_function, adam_state, profile_call
from aicf_tvm.runtime.targets import resolve_target
from scripts.harness import HYPER, MLP_SHAPES


def _median_ms(fn, repeat: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _inputs(rng: np.random.Generator) -> tuple:
    def mk():
        return tuple(tvm.runtime.tensor(rng.standard_normal(s).astype("float32")) for s in MLP_SHAPES)

    return mk(), mk(), tuple(tvm.runtime.tensor(s) for s in adam_state(MLP_SHAPES))


def bench_ours(repeat: int) -> dict:
    step = aicf_tvm.compile_optimizer_step(adam_function(MLP_SHAPES, **HYPER))
    args = _inputs(np.random.default_rng(0))
    prof = profile_call(step.vm, "main", *args)
    return {"kernels": len(prof.kernels), "extra_bytes": prof.storage_bytes,
            "ms": _median_ms(lambda: step(*args), repeat)}


def bench_tvm(repeat: int) -> dict:
    target = resolve_target("llvm")
    mod = tvm.IRModule({"main": adam_function(MLP_SHAPES, **HYPER).with_attr("global_symbol", "main")})
    vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target)),
                              tvm.cpu())
    args = _inputs(np.random.default_rng(0))
    prof = profile_call(vm, "main", *args)
    return {"kernels": len(prof.kernels), "extra_bytes": prof.storage_bytes,
            "ms": _median_ms(lambda: vm["main"](*args), repeat)}


def bench_torch(repeat: int) -> dict | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(2)
    params = [torch.nn.Parameter(torch.randn(s)) for s in MLP_SHAPES]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.Adam(params, lr=HYPER["lr"], betas=HYPER["betas"], eps=HYPER["eps"], foreach=True)
    with torch.autograd.profiler.profile() as prof:
        opt.step()
    kernels = sum(1 for e in prof.function_events if e.name.startswith("aten::_foreach"))
    return {"kernels": kernels, "extra_bytes": None, "ms": _median_ms(opt.step, repeat)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    n = sum(int(np.prod(s)) for s in MLP_SHAPES)
    print(f"Adam step, {n:,} float32 parameters in {len(MLP_SHAPES)} tensors; "
          f"P+M+V+G = {4 * 4 * n / 2**20:.1f} MiB")
    rows = {"ours (fused_adam_step, in place)": bench_ours(args.repeat),
            "TVM default pipeline": bench_tvm(args.repeat),
            "torch.optim.Adam(foreach=True)": bench_torch(args.repeat)}
    ours = rows["ours (fused_adam_step, in place)"]
    print(f"{'implementation':34} {'kernels':>8} {'extra MiB':>10} {'ms/step':>9} {'time/ours':>10}")
    for name, r in rows.items():
        if r is None:
            print(f"{name:34} (torch not installed)")
            continue
        extra = "-" if r["extra_bytes"] is None else f"{r['extra_bytes'] / 2**20:.1f}"
        print(f"{name:34} {r['kernels']:>8} {extra:>10} {r['ms']:>9.2f} {r['ms'] / ours['ms']:>10.2f}")


if __name__ == "__main__":
    main()
