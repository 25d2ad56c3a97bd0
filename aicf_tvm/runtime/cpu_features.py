"""The instruction-set features a CPU target enables, and which of them this host lacks.

A kernel compiled for ``mcpu=skylake-avx512`` (or this host's mcpu plus ``mattr
+avx512f``) dies with SIGILL on its first AVX-512 instruction where the CPU has only AVX2.
Comparing mcpu names cannot tell: a library for this host's mcpu with an extra ``mattr``
has the same name, and a library for an older CPU runs fine on a newer one.  So the
decision is made on features: LLVM lists the features a target enables
(``target_isa``: its instruction-set extensions, without LLVM's tuning flags), and Linux
lists the host's (``/proc/cpuinfo`` flags, ``isa_flags``).  Both are x86 names
here; ``LLVM_TO_CPUINFO`` pairs them.  ``export`` records the target's list, so a library
loaded where only TVM's runtime exists is checked the same way (``deploy.check_target``),
and ``CompiledModel`` refuses to run such a target before its first kernel.

Features LLVM knows that no kernel executes (``cx16``, ``xsave``, ``invpcid``, ...) are
left out of the pairing: a host without them runs our kernels all the same.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# LLVM's x86 feature name -> the /proc/cpuinfo flag of the same instructions.
LLVM_TO_CPUINFO = {
    "sse": "sse", "sse2": "sse2", "sse3": "pni", "ssse3": "ssse3", "sse4.1": "sse4_1",
    "sse4.2": "sse4_2", "sse4a": "sse4a", "avx": "avx", "avx2": "avx2", "fma": "fma",
    "fma4": "fma4", "xop": "xop", "f16c": "f16c", "bmi": "bmi1", "bmi2": "bmi2", "lzcnt": "abm",
    "popcnt": "popcnt", "movbe": "movbe", "aes": "aes", "vaes": "vaes", "pclmul": "pclmulqdq",
    "vpclmulqdq": "vpclmulqdq", "gfni": "gfni", "sha": "sha_ni", "adx": "adx",
    "avxvnni": "avx_vnni", "avxvnniint8": "avx_vnni_int8", "avxifma": "avx_ifma",
    "avx512f": "avx512f", "avx512cd": "avx512cd", "avx512bw": "avx512bw", "avx512dq": "avx512dq",
    "avx512vl": "avx512vl", "avx512ifma": "avx512ifma", "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2", "avx512vnni": "avx512_vnni", "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq", "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16", "avx512vp2intersect": "avx512_vp2intersect",
    "amx-tile": "amx_tile", "amx-int8": "amx_int8", "amx-bf16": "amx_bf16",
    "amx-fp16": "amx_fp16",
}
X86_ARCHES = ("x86_64", "i386", "i686")

# The /proc/cpuinfo flags that name instruction-set extensions (x86); every aarch64
# "Features" entry is one.
_X86_ISA = re.compile(r"(sse\S*|ssse3|pni|avx\S*|amx\S*|fma4?|f16c|bmi\d|abm|popcnt|movbe|aes|vaes|"
                      r"pclmulqdq|vpclmulqdq|gfni|sha_ni|adx)")


def isa_flags(cpuinfo: str | None = None) -> set[str]:
    """This CPU's instruction-set extensions as Linux lists them (empty where unknown)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return {f for f in value.split() if _X86_ISA.fullmatch(f)}
        if key.strip() == "Features":
            return set(value.split())
    return set()


def is_x86(spec: Mapping[str, Any]) -> bool:
    triple = str(spec.get("mtriple") or "")
    if not triple:
        import platform

        return platform.machine() in (*X86_ARCHES, "AMD64")
    return triple.startswith(X86_ARCHES)


def target_isa(spec: Mapping[str, Any]) -> list[str]:
    """The instruction-set features (LLVM's names) an LLVM x86 target enables: those its
    mcpu implies plus its mattr, minus what mattr turns off.  Needs TVM's compiler library
    (LLVM); [] for other targets."""
    if spec.get("kind") != "llvm" or not is_x86(spec):
        return []
    import tvm
    from tvm.target import codegen

    keep = {k: v for k, v in spec.items() if k in ("kind", "mtriple", "mcpu", "mattr")}
    features = codegen.llvm_get_cpu_features(tvm.target.Target(keep))
    return sorted(f for f in features if f in LLVM_TO_CPUINFO)


def missing_features(isa: Iterable[str], host_flags: set[str]) -> list[str]:
    """The features of ``isa`` (LLVM's names) whose /proc/cpuinfo flag ``host_flags``
    lacks; [] where the host's flags are unknown (no /proc/cpuinfo)."""
    if not host_flags:
        return []
    return sorted(f for f in isa if f in LLVM_TO_CPUINFO and LLVM_TO_CPUINFO[f] not in host_flags)


def unrunnable_here(spec: Mapping[str, Any]) -> list[str]:
    """The instruction-set features an LLVM target built for this machine's architecture
    enables and this CPU lacks (compiler side: ``target_isa``)."""
    if spec.get("kind") != "llvm" or not is_x86(spec) or not is_x86({}):
        return []
    return missing_features(target_isa(spec), isa_flags())
