"""Pre-packed weights: the layout transform of a constant operand runs at compile time
(DESIGN §6, materialization on constants).

The CPU GEMM rule copies B into the packed layout ``[S, N/nr, K, nr]`` inside the kernel,
on every call. When B is a constant (a weight), that copy is the same work each time:

1. ``mark_layout_free`` (after LowerEmits, before scheduling) records on each PrimFunc the
   parameters that every call site passes a Relax constant, as TVM's
   ``layout_free_buffers`` attr; a schedule rule may then mark the block that rewrites
   such a parameter's layout with ``meta_schedule.layout_rewrite_preproc``;
2. ``PrepackWeights`` (after scheduling) splits each marked block into its own PrimFunc
   (TVM's ``SplitLayoutRewritePreproc``: the kernel now takes the packed buffer) and
   evaluates that PrimFunc on the constant (``FoldConstant``): the module holds the packed
   weight, and no packing kernel runs per inference. Each prepacked port is returned (and
   recorded in the kernel's ``aicf.abi`` as its layout) so the report can name it.

Sound: the split moves the block unchanged, reading the same constant and writing the
buffer the kernel then reads, so each kernel computes the same values. A module where
the split cannot apply is left as it was (the kernel packs per call, as before).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import tvm
from tvm import relax, tirx

from aicf_tvm.emit import LAYOUT_FREE_ATTR as LAYOUT_FREE
from aicf_tvm.emit import PREPACK_ANNOTATION as PREPROC

_LOG = logging.getLogger(__name__)


def _call_tir_sites(func: relax.Function) -> list[tuple[str, list]]:
    """(PrimFunc name, argument list) of every call_tir binding of ``func``."""
    out = []
    for block in func.body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name == "relax.call_tir":
                args = v.args[1]
                out.append((v.args[0].name_hint, list(args.fields) if isinstance(args, relax.Tuple) else [args]))
    return out


def mark_layout_free(mod: tvm.IRModule, func_name: str = "main") -> tvm.IRModule:
    """Set ``layout_free_buffers`` on each PrimFunc: the inputs every call passes a constant."""
    if func_name not in [gv.name_hint for gv in mod.get_global_vars()]:
        return mod
    free: dict[str, set[int]] = {}
    for name, args in _call_tir_sites(mod[func_name]):
        constants = {i for i, a in enumerate(args) if isinstance(a, tvm.ir.Constant)}
        free[name] = free[name] & constants if name in free else constants
    for name, indices in free.items():
        func = mod[name]
        if isinstance(func, tirx.PrimFunc) and indices:
            mod[name] = func.with_attr(LAYOUT_FREE, [tirx.IntImm("int64", i) for i in sorted(indices)])
    return mod


@dataclass(frozen=True)
class Prepacked:
    """One weight packed at compile time: the kernel, its parameter, both shapes."""

    kernel: str
    param: int
    before: tuple[int, ...]
    after: tuple[int, ...]

    def describe(self) -> str:
        return (f"{self.kernel} input {self.param}: [{_dims(self.before)}] packed to [{_dims(self.after)}] "
                "at compile time")


def _dims(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape)


def _strip_marks(mod: tvm.IRModule) -> tvm.IRModule:
    """Drop ``layout_free_buffers`` from every PrimFunc (nothing downstream needs it)."""
    for gv, func in list(mod.functions_items()):
        if isinstance(func, tirx.PrimFunc) and func.attrs is not None and LAYOUT_FREE in func.attrs:
            mod[gv] = func.without_attr(LAYOUT_FREE)
    return mod


def _preproc_blocks(func: tirx.PrimFunc) -> tuple[tvm.s_tir.Schedule, list]:
    """A schedule of ``func`` and its root-level blocks marked as layout rewrites."""
    sch = tvm.s_tir.Schedule(func)
    root = sch.get_sblock("root")
    return sch, [b for b in sch.get_child_blocks(root) if PREPROC in sch.get(b).annotations]


def prepack_weights(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[Prepacked]]:
    """Split the marked layout rewrites out of their kernels and fold them on the constants."""
    marked = {gv.name_hint: func for gv, func in mod.functions_items()
              if isinstance(func, tirx.PrimFunc) and func.attrs is not None and LAYOUT_FREE in func.attrs
              and _preproc_blocks(func)[1]}
    if not marked:
        return _strip_marks(mod), []
    try:
        split = relax.transform.SplitLayoutRewritePreproc()(mod)
    except Exception as err:  # noqa: BLE001 - TVM's checks on the block structure: keep per-call packing
        _LOG.warning("weights not prepacked (%s); the kernels pack them per call", str(err).splitlines()[0])
        return _strip_marks(_unmark(mod, marked)), []
    folded = relax.transform.DeadCodeElimination()(relax.transform.FoldConstant()(split))
    packed = []
    for name, original in marked.items():
        new = f"{name}_prepacked"
        if new not in [gv.name_hint for gv in folded.get_global_vars()]:
            continue
        func = folded[new]
        for i, (old_p, new_p) in enumerate(zip(original.params, func.params)):
            before = tuple(int(d) for d in old_p.ty.shape)
            after = tuple(int(d) for d in new_p.ty.shape)
            if before != after:
                packed.append(Prepacked(new, i, before, after))
                func = _with_layout(func, i, after)
        folded[new] = func
    leftover = [n for n, _ in _call_tir_sites(folded["main"]) if n.endswith("_weight_prepack")]
    if leftover:  # a prepack that did not fold (its input was not constant after all)
        _LOG.warning("prepack kernels %s run per call: their inputs are not constants", leftover)
    return _strip_marks(folded), packed


def _with_layout(func: tirx.PrimFunc, index: int, shape: tuple[int, ...]) -> tirx.PrimFunc:
    """Record the packed layout of parameter ``index`` in the kernel's ``aicf.abi``."""
    if func.attrs is None or "aicf.abi" not in func.attrs:
        return func
    entries = [dict(e) for e in func.attrs["aicf.abi"]]
    buffers = [e for e in entries if not e.get("scalar", False)]
    if index < len(buffers):
        buffers[index]["layout"] = f"packed[{_dims(shape)}]"
        buffers[index]["prepacked"] = True
    return func.with_attr("aicf.abi", entries)


def _unmark(mod: tvm.IRModule, marked: dict) -> tvm.IRModule:
    """Remove the preproc annotations (the kernels keep packing per call)."""
    for name, func in marked.items():
        sch, blocks = _preproc_blocks(func)
        for block in blocks:
            sch.unannotate(block, PREPROC)
        mod[name] = sch.mod["main"]  # a Schedule keeps the function's attrs
    return mod


__all__ = ["Prepacked", "mark_layout_free", "prepack_weights"]
