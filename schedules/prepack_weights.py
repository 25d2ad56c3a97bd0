"""Pre-packed weights: the layout transform of a constant operand runs at compile time
(docs/design.md §6, materialization on constants).

The CPU GEMM rule copies B into the packed layout ``[S, N/nr, K, nr]`` inside the kernel,
on every call. When B is a constant (a weight), that copy is the same work each time:

1. ``mark_layout_free`` (after LowerEmits, before scheduling) records on each Emit PrimFunc
   our default rules will schedule the parameters that every call site passes a Relax
   constant, as TVM's ``layout_free_buffers`` attr; a schedule rule may then mark the block
   that rewrites such a parameter's layout with ``meta_schedule.layout_rewrite_preproc``;
2. ``prepack_weights`` (after scheduling) takes the marked kernels one at a time: it splits
   the marked blocks into their own PrimFunc (TVM's ``SplitLayoutRewritePreproc``, run on
   that kernel alone: the kernel now takes the packed buffer) and evaluates that PrimFunc on
   the constant (``FoldConstant``): the module holds the packed weight, and no packing
   kernel runs per inference. Each prepacked port is returned (and recorded in the kernel's
   ``aicf.abi`` as its layout) so the report can name it.

Sound: the split moves the block unchanged, reading the same constant and writing the
buffer the kernel then reads, so each kernel computes the same values. The split replaces
the parameter by its packed form, so a block is split only when it is the parameter's only
reader (an epilogue that also reads the weight, ``x @ W + W``, keeps the packing in the
kernel). A kernel TVM refuses to split, or whose packing does not fold to a constant, is
left as it was (it packs per call) and named in the returned refusals; the other kernels
are still prepacked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx

from aicf_tvm.core.emit import ABI_ATTR, is_scheduled
from aicf_tvm.core.emit import LAYOUT_FREE_ATTR as LAYOUT_FREE
from aicf_tvm.core.emit import PREPACK_ANNOTATION as PREPROC

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


def _is_ours_to_schedule(func: tirx.PrimFunc) -> bool:
    """An Emit kernel not yet scheduled: our default rules will schedule it (a tuned record
    already did, and is not rewritten)."""
    return func.attrs is not None and "aicf.emit" in func.attrs and not is_scheduled(func)


def mark_layout_free(mod: tvm.IRModule, func_name: str = "main") -> tvm.IRModule:
    """Set ``layout_free_buffers`` on each Emit PrimFunc still to be scheduled: the inputs
    every call passes a constant."""
    if func_name not in [gv.name_hint for gv in mod.get_global_vars()]:
        return mod
    free: dict[str, set[int]] = {}
    for name, args in _call_tir_sites(mod[func_name]):
        constants = {i for i, a in enumerate(args) if isinstance(a, tvm.ir.Constant)}
        free[name] = free[name] & constants if name in free else constants
    for name, indices in free.items():
        func = mod[name]
        if isinstance(func, tirx.PrimFunc) and indices and _is_ours_to_schedule(func):
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


@dataclass(frozen=True)
class PrepackRefused:
    """A kernel with a marked packing that still packs per call, and why."""

    kernel: str
    reason: str

    def describe(self) -> str:
        return f"{self.kernel}: packs its constant operand per call ({self.reason})"


def _dims(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape)


def _strip_marks(mod: tvm.IRModule) -> tvm.IRModule:
    """Drop ``layout_free_buffers`` from every PrimFunc (nothing downstream needs it)."""
    for gv, func in list(mod.functions_items()):
        if isinstance(func, tirx.PrimFunc) and func.attrs is not None and LAYOUT_FREE in func.attrs:
            mod[gv] = func.without_attr(LAYOUT_FREE)
    return mod


def _is_marked(block: s_tir.SBlock) -> bool:
    return PREPROC in block.annotations


def preproc_blocks(func: tirx.PrimFunc) -> list[s_tir.SBlock]:
    """The blocks of ``func`` marked as layout rewrites, wherever they sit (any body shape:
    a kernel TVM built itself need not have a root block)."""
    found: list[s_tir.SBlock] = []
    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, lambda b: found.append(b) if _is_marked(b) else None)])
    return found


def shared_sources(func: tirx.PrimFunc) -> list[tvm.ir.Expr]:
    """Sources of marked blocks that something outside the marked blocks also loads.

    Splitting a marked block replaces its source parameter by the packed buffer, so any
    other read of the source would dangle (``x @ W + W``: the epilogue reads W).
    """
    sources = [b.reads[0].source for b in preproc_blocks(func) if len(b.reads) == 1]
    shared: list[tvm.ir.Expr] = []

    def on_block(block: s_tir.SBlock):
        return tvm_ffi.WalkResult.SKIP if _is_marked(block) else None

    def on_load(load: tvm.ir.TensorLoad) -> None:
        for s in sources:
            if load.source.same_as(s) and not any(s.same_as(x) for x in shared):
                shared.append(s)

    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, on_block), (tvm.ir.TensorLoad, on_load)], order="pre")
    return shared


def _unmark(func: tirx.PrimFunc, keep=lambda block: False) -> tirx.PrimFunc:
    """``func`` without the preproc annotation on every marked block but those ``keep``
    accepts (those blocks pack per call)."""
    sch = s_tir.Schedule(func)
    for block in preproc_blocks(func):
        if not keep(block):
            sch.unannotate(sch.get_sblock(block.name_hint), PREPROC)
    return sch.mod["main"]  # a Schedule keeps the function's attrs


PREPACKED_SUFFIX = "_prepacked"  # TVM's name for a kernel whose weight packing was split out


def _split(mod: tvm.IRModule, gv: tvm.ir.GlobalVar, fold: Callable[[tvm.IRModule], tvm.IRModule]
           ) -> tuple[tvm.IRModule, list[Prepacked]]:
    """``mod`` (not changed) with ``gv``'s marked blocks split out and folded on the
    constants by ``fold``.

    TVM's split visits every PrimFunc of its module and refuses the whole module for one
    it cannot read, so it sees the Relax functions and ``gv`` only.
    """
    original = mod[gv]
    sub = tvm.IRModule({**{g: f for g, f in mod.functions_items() if isinstance(f, relax.Function)}, gv: original})
    split = relax.transform.SplitLayoutRewritePreproc()(sub)
    added = {g.name_hint for g in split.get_global_vars()} - {g.name_hint for g in sub.get_global_vars()}
    new = f"{gv.name_hint}{PREPACKED_SUFFIX}"
    if new not in added:
        raise ValueError("TVM's SplitLayoutRewritePreproc did not split it")
    taken = added & {g.name_hint for g in mod.get_global_vars()}
    if taken:
        raise ValueError(f"the module already has functions named {sorted(taken)}")
    out = mod.clone()
    for g, f in split.functions_items():
        if isinstance(f, relax.Function) or g.name_hint in added:
            out[g] = f
    out = relax.transform.DeadCodeElimination()(fold(out))
    prepack = f"{gv.name_hint}_weight_prepack"
    if any(n == prepack for _, f in out.functions_items() if isinstance(f, relax.Function)
           for n, _ in _call_tir_sites(f)):
        raise ValueError("its packing did not fold to a constant")
    func = out[new]
    packed = []
    for i, (old_p, new_p) in enumerate(zip(original.params, func.params)):
        # activations may have symbolic dims (``seq``, a fresh Var in the split function):
        # only a packed weight changes shape, and a weight is a constant: its dims are numbers
        if [str(d) for d in old_p.ty.shape] == [str(d) for d in new_p.ty.shape]:
            continue
        before = tuple(int(d) for d in old_p.ty.shape)
        after = tuple(int(d) for d in new_p.ty.shape)
        packed.append(Prepacked(new, i, before, after))
        func = _with_layout(func, i, after)
    out[new] = func
    return out, packed


def prepack_weights(mod: tvm.IRModule, fold: Callable[[tvm.IRModule], tvm.IRModule] | None = None
                    ) -> tuple[tvm.IRModule, list[Prepacked], list[PrepackRefused]]:
    """Split the marked layout rewrites out of their kernels and fold them on the constants
    (``fold``: Relax's ``FoldConstant`` by default), one kernel at a time; a kernel that
    cannot be prepacked keeps packing per call."""
    fold = fold if fold is not None else relax.transform.FoldConstant()
    packed: list[Prepacked] = []
    refused: list[PrepackRefused] = []
    names = sorted(gv.name_hint for gv, f in mod.functions_items()
                   if isinstance(f, tirx.PrimFunc) and f.attrs is not None and LAYOUT_FREE in f.attrs)
    for name in names:
        if name not in {g.name_hint for g in mod.get_global_vars()}:
            continue  # folded away (its inputs became constants) while an earlier kernel was split
        gv = mod.get_global_var(name)
        try:
            if not preproc_blocks(mod[gv]):
                continue
            shared = shared_sources(mod[gv])
            if shared:
                mod[gv] = _unmark(mod[gv],
                                  keep=lambda b, shared=shared: not any(b.reads[0].source.same_as(s) for s in shared))
                refused.append(PrepackRefused(name, "the kernel also reads the unpacked weight"))
                if not preproc_blocks(mod[gv]):
                    continue
            mod, done = _split(mod, gv, fold)
            packed.extend(done)
        except Exception as err:  # noqa: BLE001 - TVM's checks on the block structure: keep per-call packing
            reason = next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)
            _LOG.warning("weights of %s not prepacked (%s); the kernel packs them per call", name, reason)
            refused.append(PrepackRefused(name, reason))
            try:
                mod[gv] = _unmark(mod[gv])
            except Exception:  # noqa: BLE001 - a left-over mark only names a block: same values
                pass
    return _strip_marks(mod), packed, refused


def _with_layout(func: tirx.PrimFunc, index: int, shape: tuple[int, ...]) -> tirx.PrimFunc:
    """Record the packed layout of parameter ``index`` in the kernel's ``aicf.abi``."""
    if func.attrs is None or ABI_ATTR not in func.attrs:
        return func
    entries = [dict(e) for e in func.attrs[ABI_ATTR]]
    buffers = [e for e in entries if not e.get("scalar", False)]
    if index < len(buffers):
        buffers[index]["layout"] = f"packed[{_dims(shape)}]"
        buffers[index]["prepacked"] = True
    return func.with_attr(ABI_ATTR, entries)


__all__ = ["PrepackRefused", "Prepacked", "mark_layout_free", "prepack_weights", "preproc_blocks", "shared_sources"]
