"""GPU latency: ours (``aicf_tvm.compile``) next to TVM's default CUDA pipeline
(``relax.get_default_pipeline``: LegalizeOps, FuseOps, FuseTIR, dlight) and PyTorch eager.

Models: the built-in encoder layer (BERT-base, seq 128; PyTorch twin built from the same
weights) and the light ResNet-50 from the onnx wheel (no PyTorch twin offline).  Each
build's output is checked against the other's before timing; the median of
``--repeat`` timed runs (each ``--number`` calls) is printed.  ``--compile-only`` builds both
pipelines for CUDA without a GPU (what this machine can check).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.gpu.torch_reference

import tvm
from tvm import relax

import aicf_tvm
from aicf_tvm.models import encoder_layer
from tests.conftest import light_model_path, random_inputs

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})


def tvm_default(mod: tvm.IRModule):
    return tvm.compile(mod, target=CUDA, relax_pipeline=relax.get_default_pipeline(CUDA))


def time_vm(executable, inputs: list[np.ndarray], number: int, repeat: int) -> tuple[float, np.ndarray]:
    """Median ms per call on the GPU (TVM's time_evaluator syncs the device) and the output."""
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(executable, dev)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    out = vm["main"](*args)
    out = (out[0] if not hasattr(out, "numpy") else out).numpy()
    result = vm.time_evaluator("main", dev, number=number, repeat=repeat)(*args)
    return float(np.median(result.results)) * 1e3, out


def time_torch(fn, x: np.ndarray, number: int, repeat: int) -> tuple[float, np.ndarray]:
    import torch

    xt = torch.from_numpy(x).cuda()
    out = fn(xt)
    torch.cuda.synchronize()
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn(xt)
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - start) / number * 1e3)
    return statistics.median(runs), out.cpu().numpy()


def models() -> dict[str, tuple[tvm.IRModule, object]]:
    mod, weights = encoder_layer(return_params=True)
    return {"encoder_layer": (mod, weights), "resnet50": (aicf_tvm.from_onnx(light_model_path("resnet50")), None)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile-only", action="store_true", help="build for CUDA, run nothing")
    parser.add_argument("--number", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    if not args.compile_only and not tvm.cuda(0).exist:
        print("gpu_bench: TVM sees no CUDA device (use --compile-only)", file=sys.stderr)
        return 1
    rows, mismatches = [], 0
    for name, (mod, weights) in models().items():
        start = time.perf_counter()
        ours = aicf_tvm.compile(mod, target=CUDA)
        t_ours = time.perf_counter() - start
        start = time.perf_counter()
        default = tvm_default(mod)
        t_default = time.perf_counter() - start
        print(f"{name}: compiled, ours {t_ours:.1f} s, TVM default {t_default:.1f} s", flush=True)
        if args.compile_only:
            continue
        inputs = random_inputs(mod)
        ms_ours, out_ours = time_vm(ours.executable, inputs, args.number, args.repeat)
        ms_default, out_default = time_vm(default, inputs, args.number, args.repeat)
        diff = float(np.abs(out_ours - out_default.reshape(out_ours.shape)).max())
        mismatches += not np.allclose(out_ours, out_default.reshape(out_ours.shape), rtol=2e-3, atol=2e-3)
        ms_torch = None
        if weights is not None:
            from tests.gpu.torch_reference import torch_encoder_layer

            ms_torch, out_torch = time_torch(torch_encoder_layer(weights, heads=12), inputs[0], args.number,
                                             args.repeat)
            diff = max(diff, float(np.abs(out_ours - out_torch).max()))
        rows.append((name, ms_ours, ms_default, ms_torch, diff))
    if rows:
        print(f"\n{'model':16s} {'AICF':>10s} {'TVM default':>12s} {'PyTorch':>10s} {'vs TVM':>8s}  max|diff|")
        for name, ours_ms, default_ms, torch_ms, diff in rows:
            torch_text = f"{torch_ms:8.3f}ms" if torch_ms is not None else f"{'-':>10s}"
            print(f"{name:16s} {ours_ms:8.3f}ms {default_ms:10.3f}ms {torch_text} "
                  f"{default_ms / ours_ms:7.2f}x  {diff:.2e}")
        print(f"(median of {args.repeat} x {args.number} calls, {tvm.cuda(0).device_name})")
    if mismatches:
        print(f"gpu_bench: {mismatches} model(s) differ from TVM's default build", file=sys.stderr)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
