"""Shared fixtures: light ONNX models from the onnx wheel, a VM runner, a host target, and
``rand``, one generator of distinct operands per test (``tests/helpers.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax

import aicf_tvm.library  # noqa: F401 - registers the Emit library: FuseEmits() tries its candidates

from .helpers import Operands

LIGHT_DIR = Path(__import__("onnx").__file__).parent / "backend" / "test" / "data" / "light"
LIGHT_MODELS = sorted(p.stem.removeprefix("light_") for p in LIGHT_DIR.glob("light_*.onnx"))

os.environ.setdefault("AICF_DEBUG", "1")  # verify_contracts after every pass
# no compile cache unless a test asks for one (cache_dir=): tests inspect what compile
# built, and must not write into the user's cache folder
os.environ["AICF_CACHE_DIR"] = "off"


def light_model_path(name: str) -> Path:
    return LIGHT_DIR / f"light_{name}.onnx"


def llvm_target() -> tvm.target.Target:
    return tvm.target.Target({"kind": "llvm", "num-cores": 2})


def run_vm(mod: tvm.IRModule, *args: np.ndarray, pipeline: bool = True) -> list[np.ndarray]:
    """Build ``mod`` with TVM's default pipeline (the unoptimized reference) and run it."""
    target = llvm_target()
    ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target) if pipeline else None)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    outs = out if isinstance(out, (list, tuple)) or type(out).__name__ == "Array" else [out]
    return [o.numpy() for o in outs]


def random_inputs(mod: tvm.IRModule, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for p in mod["main"].params:
        shape = [int(d) for d in p.ty.shape.values]
        out.append(rng.standard_normal(shape).astype(str(p.ty.dtype)))
    return out


@pytest.fixture(scope="session")
def light_models() -> dict[str, Path]:
    return {name: light_model_path(name) for name in LIGHT_MODELS}


@pytest.fixture
def rand() -> Operands:
    """``rand(*shape)``: standard-normal float32 operands, each call new values."""
    return Operands(0)
