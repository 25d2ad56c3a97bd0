"""The default schedule rules per target, in the order they are tried."""

from tvm.s_tir.dlight.base import ScheduleRule
from tvm.target import Target

from aicf_tvm.core.options import CompileOptions

from . import cpu, cuda


def default_rules(target: Target, options: CompileOptions | None = None) -> list[ScheduleRule]:
    """The rules tried, in order, for PrimFuncs compiled for ``target`` (empty if none);
    the CPU rules with knobs read them from ``options``."""
    if target.kind.name == "llvm":
        return [
            cpu.VNNIMatmul(options),
            cpu.Gemm(options),
            cpu.VNNIConv2d(options),
            cpu.BlockedConv2d(options),
            cpu.Depthwise(),
            cpu.Conv2d(options=options),
            cpu.Attention(options),
            cpu.BlockedNorm(),
            cpu.FullMinMax(),
            cpu.Reduction(),
            cpu.Elementwise(),
            cpu.Fallback(),
        ]
    if "gpu" in target.keys:
        return cuda.gpu_rules()
    return []
