"""Target resolution: ``"llvm"`` means this machine's CPU (mcpu and cores), ``"cuda"`` a GPU."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import tvm

from aicf_tvm.core.errors import TargetError
from aicf_tvm.runtime import cpu_features

# a target as users give it: a Target, its exported dict, its JSON text, "llvm" or "cuda"
TargetLike = tvm.target.Target | Mapping[str, Any] | str

DEFAULT_CUDA_ARCH = "sm_90"


def host_cpu_target(num_cores: int | None = None) -> tvm.target.Target:
    """The host CPU as an LLVM target with its mcpu, and num-cores (MetaSchedule needs it)."""
    host = tvm.target.Target.from_device(tvm.cpu()).export()
    if num_cores is None:
        num_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = num_cores
    keep = {k: v for k, v in host.items() if k in ("kind", "mtriple", "mcpu", "mattr")}
    return tvm.target.Target({**keep, **_masked(keep), "num-cores": int(cores or 1)})


def _masked(spec: dict) -> dict:
    """``mattr`` turning off what the host's mcpu implies but this CPU does not offer: LLVM
    names the host CPU by its model, and a VM may hide some of that model's extensions
    (AVX-512, AMX) from its guests; code using them would die of SIGILL."""
    hidden = cpu_features.missing_features(cpu_features.target_isa(spec), cpu_features.isa_flags())
    if not hidden:
        return {}
    return {"mattr": [*spec.get("mattr", []), *(f"-{f}" for f in hidden)]}


def cuda_host_target() -> tvm.target.Target:
    """The host side of a CUDA build: this machine's triple without its mcpu. That code
    (the VM's glue, shape functions) is not worth tuning, and generic x86-64 code runs on
    whatever CPU the GPU host has."""
    triple = tvm.target.Target.from_device(tvm.cpu()).export().get("mtriple")
    return tvm.target.Target({"kind": "llvm", **({"mtriple": triple} if triple else {})})


def resolve_target(target: TargetLike) -> tvm.target.Target:
    """A ``tvm.target.Target`` from a Target, a dict, a JSON string, ``"llvm"`` or ``"cuda"``."""
    if isinstance(target, tvm.target.Target):
        return target
    spec = target
    if isinstance(target, str):
        text = target.strip()
        if text == "llvm":
            return host_cpu_target()
        if text == "cuda":
            return tvm.target.Target({"kind": "cuda", "arch": DEFAULT_CUDA_ARCH}, host=cuda_host_target())
        if text.startswith("{"):
            try:
                spec = json.loads(text)
            except json.JSONDecodeError as err:
                raise TargetError(f"target {text!r} is not valid JSON: {err}") from err
        else:
            raise TargetError(f"unknown target {text!r}: use 'llvm', 'cuda' or a JSON target dict")
    if not isinstance(spec, dict):
        raise TargetError(f"unknown target {target!r}")
    spec = dict(spec)
    _check_spec(spec, target)
    if spec.get("kind") == "llvm" and "mcpu" not in spec:
        host = host_cpu_target(spec.get("num-cores"))
        spec = {**host.export(), **spec}
        spec = {k: v for k, v in spec.items() if k in ("kind", "mtriple", "mcpu", "mattr", "num-cores",
                                                        "opt-level", "tag", "keys") and v not in ("", None)}
    try:
        if spec.get("kind") == "cuda":
            return tvm.target.Target(spec, host=cuda_host_target())
        return tvm.target.Target(spec)
    except Exception as err:
        raise TargetError(f"unknown target {target!r}: {err}") from err


def _check_spec(spec: dict, given: TargetLike) -> None:
    """Refuse what TVM would refuse, before we merge in host keys: unknown keys (TVM's
    message names them), and an LLVM ``mcpu`` LLVM does not know (LLVM would only warn
    and silently build generic code)."""
    try:  # without mcpu: an unknown one would make LLVM print an error line, then go generic
        target = tvm.target.Target({k: v for k, v in spec.items() if k != "mcpu"})
    except Exception as err:
        raise TargetError(f"unknown target {given!r}: {err}") from err
    mcpu = spec.get("mcpu")
    if spec.get("kind") == "llvm" and mcpu:
        from tvm.target import codegen

        if str(mcpu) not in {str(c) for c in codegen.llvm_get_cpu_archlist(target)}:
            raise TargetError(f"target {given!r}: LLVM does not know the CPU mcpu={mcpu!r} "
                              "(use 'llvm' for this machine's CPU)")


def describe(target: tvm.target.Target | Mapping[str, Any]) -> str:
    """``kind mcpu=... num-cores=...`` of a Target or its exported dict."""
    attrs = dict(target) if isinstance(target, Mapping) else target.export()
    bits = [attrs.get("kind", "?")]
    for key in ("mcpu", "arch", "num-cores"):
        if attrs.get(key):
            bits.append(f"{key}={attrs[key]}")
    return " ".join(str(b) for b in bits)
