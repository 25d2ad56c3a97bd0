"""The default schedule rules per target, in the order they are tried."""

from tvm.s_tir.dlight.base import ScheduleRule
from tvm.target import Target

from . import cpu, cuda


def default_rules(target: Target) -> list[ScheduleRule]:
    """The rules tried, in order, for PrimFuncs compiled for ``target`` (empty if none)."""
    if target.kind.name == "llvm":
        matmul_rules = [getattr(cpu, name, None) for name in ("Gemm", "BlockedConv2d", "Depthwise", "Conv2d")]
        return [
            *(rule() for rule in matmul_rules if rule is not None),
            cpu.Attention(),
            cpu.BlockedNorm(),
            cpu.Reduction(),
            cpu.Elementwise(),
            cpu.Fallback(),
        ]
    if "gpu" in target.keys:
        return cuda.gpu_rules()
    return []
