"""GPU (CUDA) default rules: dlight's GPU rules, each held to a complete thread binding.

Order: ``Matmul`` (matmul, batched matmul, conv2d through its im2col view), ``GEMV``,
``Reduction`` (row reductions, RMS norm, pooling sums), ``GeneralReduction`` (softmax,
layer norm), then ``Fallback``, which inlines what it can and binds the spatial loops of
every remaining block to blocks/threads (reductions run serially per thread).  Our fused
kernels (attention: matmul, scale, mask, softmax, matmul in one PrimFunc) reach Fallback,
which launches one kernel per remaining block: valid, not fast.

A dlight rule can return a schedule that leaves a block outside any thread binding (the
build then fails with "did you forget to bind?"), so each rule is wrapped: such a schedule
counts as "not applicable" and the next rule is tried.  The wrapper also hands the rule
the function with its constant stores opaque to TVM's folder (``schedules.constants``):
dlight inlines them, which could fold an immediate unsoundly or abort the process.
"""

import tvm_ffi
from tvm import IRModule, s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.target import Target

from .constants import opaque_constant_stores


def unbound_blocks(sch: s_tir.Schedule) -> list[str]:
    """Names of the innermost blocks not under a thread-bound loop."""
    body = sch.mod["main"].body
    if not isinstance(body, s_tir.SBlockRealize):
        return ["<root>"]
    pending = list(sch.get_child_blocks(sch.get_sblock(body.block.name_hint)))
    unbound = []
    while pending:
        block = pending.pop()
        children = sch.get_child_blocks(block)
        if children:
            if not _is_bound(sch, block):
                pending.extend(children)
            continue
        if not _is_bound(sch, block):
            unbound.append(sch.get(block).name_hint)
    return unbound


def _is_bound(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    return any(sch.get(loop).thread_binding is not None for loop in sch.get_loops(block))


def host_bound_kernels(mod: IRModule) -> list[str]:
    """PrimFuncs of ``mod`` that store to a buffer outside any GPU thread binding: built for
    a GPU target, such a loop runs on the host, over device memory."""
    names = []
    for gvar, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        seen = {"store": False, "bound": False}

        def on_for(loop: tirx.For, seen: dict = seen) -> None:
            seen["bound"] |= loop.kind == tirx.ForKind.THREAD_BINDING

        def on_attr(attr: tirx.AttrStmt, seen: dict = seen) -> None:
            seen["bound"] |= attr.attr_key == "thread_extent"

        def on_store(_: tirx.BufferStore, seen: dict = seen) -> None:
            seen["store"] = True

        tvm_ffi.structural_walk(func.body, [(tirx.For, on_for), (tirx.AttrStmt, on_attr),
                                            (tirx.BufferStore, on_store)])
        if seen["store"] and not seen["bound"]:
            names.append(gvar.name_hint)
    return sorted(names)


class RequireThreadBinding(ScheduleRule):
    """``rule``, except that a schedule leaving a block unbound counts as None."""

    def __init__(self, rule: ScheduleRule):
        self.rule = rule

    def is_target_available(self, target: Target) -> bool:
        return self.rule.is_target_available(target)

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        sch = self.rule.apply(opaque_constant_stores(func), target, tunable)
        if isinstance(sch, list):
            sch = sch[0] if sch else None
        if sch is None or unbound_blocks(sch):
            return None
        return sch

    def __repr__(self) -> str:
        return f"RequireThreadBinding({type(self.rule).__name__})"


def gpu_rules() -> list[ScheduleRule]:
    """Rules for GPU targets, most specific first; ``Fallback`` binds anything left."""
    return [
        RequireThreadBinding(rule)
        for rule in (
            dl.gpu.Matmul(),
            dl.gpu.GEMV(),
            dl.gpu.Reduction(),
            dl.gpu.GeneralReduction(),
            dl.gpu.Fallback(),
        )
    ]
