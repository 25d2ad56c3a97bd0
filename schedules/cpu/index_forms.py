"""One form for a head index: ``(x % (k * c)) % c`` becomes ``x % c``.

A loop over batch x heads of symbolic extent ``b * c`` (the merged axis of a head split)
gives every block of a fused kernel a head index ``v % c`` with ``v = x % (b * c)``.  Once
``ConvertBlocksToOpaque`` substitutes the bindings, some blocks read ``x % (b * c) % c`` and
others ``x % c`` (whichever ``compute_at`` simplified), TVM's analyzer does not prove the
two equal, and ``CompactBufferAllocation`` then sizes a per-tile buffer for every head: a
dynamic attention kernel's softmax buffers were ``seq x seq`` per tile, not ``rows x seq``.

``FoldNestedMods`` runs right after ``ConvertBlocksToOpaque`` (``parallel_guard._pipeline``).
Why it is exact: with ``c > 0`` dividing ``m`` (``m != 0``), ``floormod(x, m) = x - q m`` for
an integer ``q``, and ``q m`` is a multiple of ``c``, so both sides have the same
``floormod`` by ``c``.  ``m = 0`` is a division by zero on both sides, never evaluated by
a loop of extent ``b * c = 0``.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.sym.analyzer import Analyzer
from tvm.target import Target

from .llvm_pass import llvm_prim_func_pass


def _folded(expr: tirx.FloorMod) -> tirx.Expr:
    inner, modulus = expr.a, expr.b
    if (isinstance(inner, tirx.FloorMod) and isinstance(modulus, tirx.IntImm) and modulus.value > 0
            and Analyzer().can_prove(tirx.floormod(inner.b, modulus) == 0)):
        return tirx.floormod(inner.a, modulus)
    return expr


def fold_nested_mods(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every ``(x % m) % c`` whose ``c`` divides ``m`` written ``x % c``."""
    return tvm_ffi.structural_map(func, [(tirx.FloorMod, _folded)])


def FoldNestedMods(target: Target | None = None) -> tvm.transform.Pass:
    """PrimFunc pass applying ``fold_nested_mods`` to the PrimFuncs compiled for LLVM."""
    return llvm_prim_func_pass(fold_nested_mods, target, "FoldNestedMods")


def opaque_blocks() -> list[tvm.transform.Pass]:
    """The S-TIR pipeline's passes up to ``ConvertBlocksToOpaque``; the rest of the
    pipeline must then run without them (``after_opaque_blocks``)."""
    return [s_tir.transform.CanonicalizeLoop(), s_tir.transform.LowerCrossThreadReduction(),
            s_tir.transform.LowerInitBlock(), s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
            s_tir.transform.ConvertBlocksToOpaque()]


def after_opaque_blocks(lower: tvm.transform.Pass) -> tvm.transform.Pass:
    """``lower`` (the S-TIR pipeline) with the passes of ``opaque_blocks`` disabled, for a
    module they have run on already.

    A second run is not a no-op: ``PlanAndUpdateBufferAllocationLocation`` places each
    buffer at the lowest common ancestor of its accesses, lifted above the loops that a
    reduction block's reduce iterators are bound to.  Opaque blocks have no iterators, so
    a second run moved an accumulator that only its reduction block reads (the running
    maximum of argmax and argmin) inside the reduction loop: a fresh, uninitialized buffer
    per step, and wrong indices.  The inner context keeps the outer one's opt level,
    config and pass lists (not its instruments).
    """
    skipped = [p.info.name for p in opaque_blocks()]

    @tvm.transform.module_pass(opt_level=0, name="LowerAfterOpaqueBlocks")
    def _lower(mod: tvm.IRModule, _ctx: object) -> tvm.IRModule:
        outer = tvm.transform.PassContext.current()
        with tvm.transform.PassContext(opt_level=outer.opt_level, required_pass=list(outer.required_pass),
                                       disabled_pass=[*outer.disabled_pass, *skipped],
                                       config=dict(outer.config.items())):
            return lower(mod)

    return _lower
