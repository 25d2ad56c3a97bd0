"""Compile every built-in model and every ONNX light model for CUDA (sm_90), compile only.

Prints one line per model: ok (kernel count, seconds) or the error.  Exit code 1 if any
model failed.  Needs nvcc, no GPU.  ``python -m scripts.cuda_compile_all [NAME ...]``
(names: built-in model names or light model names such as ``resnet50``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import onnx

import aicf_tvm
from aicf_tvm.driver.models import BUILTIN_MODELS

CUDA = {"kind": "cuda", "arch": "sm_90"}
LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def cuda_kernel_count(executable) -> int:
    """``__global__`` kernels in the CUDA module imported by the built executable (0: none)."""
    pending = [executable.mod]
    while pending:
        module = pending.pop()
        if module.kind == "cuda":
            return module.inspect_source().count("__global__")
        pending.extend(module.imports)
    return 0


def models() -> dict[str, object]:
    found: dict[str, object] = {name: build for name, build in BUILTIN_MODELS.items()}
    for path in sorted(LIGHT_DIR.glob("light_*.onnx")):
        found[path.stem.removeprefix("light_")] = path
    return found


def main(names: list[str]) -> int:
    table = models()
    failed = 0
    for name in names or list(table):
        spec = table[name]
        start = time.perf_counter()
        try:
            mod = spec() if callable(spec) else aicf_tvm.from_onnx(str(spec))
            compiled = aicf_tvm.compile(mod, target=CUDA)
            kernels = cuda_kernel_count(compiled.executable)
            if kernels == 0:
                raise RuntimeError("the build holds no CUDA kernels")
            print(f"ok    {name:24s} {kernels:4d} CUDA kernels  {time.perf_counter() - start:7.1f} s", flush=True)
        except Exception as err:  # noqa: BLE001 - report every model, then fail
            failed += 1
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
            print(f"FAIL  {name:24s} {type(err).__name__}: {first}  {time.perf_counter() - start:7.1f} s",
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
