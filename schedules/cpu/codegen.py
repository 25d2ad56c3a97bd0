"""The LLVM target CPU kernels are compiled for: the schedule's target plus code-generation
preferences that change which instructions LLVM picks, never what they compute.

``+prefer-no-gather`` on x86: LLVM's SLP vectorizer packs scalar code that reads several
rows at a stride (the row reductions ``Reduction.interleave_rows`` steps together, the
attention's row max and sum with a key tail) into ``vgatherdps``, which is slower than
the scalar loads it replaces on every x86 core we measured, and slower still under the
Gather Data Sampling microcode mitigation on Intel.  The feature only takes gathers out
of the vectorizers' choices (the same operations run in the same order: the same bits);
the row reductions it concerns (residual-add + layer norm, attention's row max and sum)
ran faster, and every convolution of ResNet-50 and MobileNetV2 compiled to the same
instructions as before.

Kept out of the target the rules, the tuning records and ``describe`` see: it is not a
property of the machine, and a record tuned without it stays valid.
"""

from __future__ import annotations

import tvm
from tvm.target import Target, codegen

NO_GATHER = "+prefer-no-gather"
X86_TRIPLES = ("x86_64", "i386", "i686")
# LLVM learned prefer-no-gather in version 17; an older one would warn and ignore it.
NO_GATHER_SINCE_LLVM = 17


def _is_x86(target: Target) -> bool:
    triple = str(target.attrs.get("mtriple", "") or codegen.llvm_get_system_triple())
    return triple.startswith(X86_TRIPLES)


def codegen_target(target: Target) -> Target:
    """``target`` with the code-generation features above, for an x86 LLVM target; any
    other target (CUDA, Arm, a target that states its own gather preference) unchanged."""
    if target.kind.name != "llvm" or not _is_x86(target):
        return target
    if codegen.llvm_version_major() < NO_GATHER_SINCE_LLVM:
        return target
    spec = dict(target.export())
    mattr = [str(f) for f in spec.get("mattr", [])]
    if any(f.lstrip("+-") == NO_GATHER[1:] for f in mattr):
        return target
    spec["mattr"] = [*mattr, NO_GATHER]
    return tvm.target.Target(spec, host=target.host)
