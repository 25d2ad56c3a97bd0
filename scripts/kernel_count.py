"""Kernels per inference: TVM's own pipeline against ours, per model.

    python -m scripts.kernel_count [--models encoder_layer decoder_block squeezenet ...]

TVM's count is the call_tir bindings of ``main`` after the CPU backend's
library-dispatch and legalize stages (``relax.get_default_pipeline`` runs exactly
those, then FuseOps + FuseTIR, before lowering); ours is ``CompiledModel.kernels``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tvm
from tvm.relax.backend.cpu_generic import pipeline as cpu

from aicf_tvm.driver.frontends import load_model
from aicf_tvm.driver.pipeline import run_pipeline
from aicf_tvm.runtime.targets import resolve_target
from relax_passes.lower_emits import kernel_calls

LIGHT = Path(__import__("onnx").__file__).parent / "backend" / "test" / "data" / "light"


def tvm_kernels(mod: tvm.IRModule, target: tvm.target.Target) -> list[str]:
    seq = tvm.transform.Sequential([*cpu.library_dispatch_passes(target), *cpu.legalize_passes(target)])
    with target:
        return kernel_calls(seq(mod)["main"])


def our_kernels(mod: tvm.IRModule, target: tvm.target.Target) -> list[str]:
    return kernel_calls(run_pipeline(mod, target, until="schedule").lowered["main"])


def resolve(name: str) -> tvm.IRModule:
    path = LIGHT / f"light_{name}.onnx"
    return load_model(str(path) if path.exists() else name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["encoder_layer", "decoder_block", "squeezenet", "resnet50"])
    args = parser.parse_args()
    target = resolve_target("llvm")
    print(f"{'model':<16} {'TVM':>5} {'ours':>5} {'ratio':>6}")
    for name in args.models:
        mod = resolve(name)
        theirs, ours = len(tvm_kernels(mod, target)), len(our_kernels(mod, target))
        print(f"{name:<16} {theirs:>5} {ours:>5} {ours / theirs:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
