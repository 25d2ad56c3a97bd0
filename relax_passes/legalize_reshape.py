"""Reshapes legalized axis group by axis group.

TOPI's reshape flattens the whole output index and unravels it in the input shape. With a
symbolic extent the divisions by products of extents (``(o0 * seq + o1) // (seq * 2)``)
do not simplify (TVM's simplifier has no ``x // y == 0`` for a symbolic ``0 <= x < y``),
they nest one level per axis, and LLVM took 17 minutes on one such kernel (a grouped-query
attention's ``repeat_kv``). Most reshapes only merge or split neighbouring axes
(``[batch, seq, 128] -> [batch * seq, 128]``, ``[batch, 1, 2, seq, 64] -> [batch * 2, seq,
64]``): the axes fall into consecutive groups whose extents have the same product on both
sides, and each input index is computed from the output indices of its own group, so
``[batch, 1, 2] -> [batch * 2]`` indexes ``(o // 2, 0, o % 2)`` and an axis in a group of
its own is indexed as it is.

Static shapes take the same kernel: TOPI's flat index, once a fused kernel inlines it,
stays half simplified (GPT-2's ``[128, 3072] -> [1, 128, 3072]`` read the GEMM's result at
``(j // 3072 + i) % 128``: nothing bounds ``j`` where the index is built), and the GEMM rule
then could not place the GELU epilogue inside its tile; grouped, the read is ``[i, j]``.

``group_axes`` finds the groups by factoring each extent into a constant and a multiset of
symbolic factors, extending the side whose product divides the other's until they are
equal; a reshape it cannot group keeps TOPI's kernel. Sound: within a group the
row-major flat index of the output indices is the one of the input indices (the groups'
products are equal and the groups are consecutive), so the element read is the one
TOPI's kernel reads. Used as the ``relax.reshape`` entry of
``LegalizeOps`` in ``LowerEmits``; ``RewriteDataflowReshape`` still recognizes the kernel
as a reshape.
"""

from __future__ import annotations

import tvm_ffi
from tvm import relax, te, tirx, topi


def _factors(extent: tirx.Expr) -> tuple[int, list[tirx.Expr]]:
    """``extent`` as (constant, symbolic factors): ``batch * seq * 2`` is (2, [batch, seq])."""
    if isinstance(extent, tirx.IntImm):
        return int(extent.value), []
    if isinstance(extent, tirx.Mul):
        (ca, fa), (cb, fb) = _factors(extent.a), _factors(extent.b)
        return ca * cb, fa + fb
    return 1, [extent]


def _divides(a: tuple[int, list], b: tuple[int, list]) -> bool:
    """Whether product ``a`` divides product ``b`` for every binding (a sub-multiset)."""
    if a[0] == 0 or b[0] % a[0] != 0:
        return False
    rest = list(b[1])
    for f in a[1]:
        k = next((i for i, g in enumerate(rest) if tvm_ffi.structural_equal(f, g)), None)
        if k is None:
            return False
        rest.pop(k)
    return True


def _times(a: tuple[int, list], b: tuple[int, list]) -> tuple[int, list]:
    return a[0] * b[0], a[1] + b[1]


def _is_one(extent: tirx.Expr) -> bool:
    return isinstance(extent, tirx.IntImm) and extent.value == 1


def group_axes(src: list, dst: list) -> list[tuple[list[int], list[int]]] | None:
    """Consecutive (input axes, output axes) groups of equal extent products, or None.

    Extent-1 axes left over at the end join the last group (their index is 0)."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) and j < len(dst):
        gi, gj = [i], [j]
        pi, pj = _factors(src[i]), _factors(dst[j])
        i, j = i + 1, j + 1
        while not (_divides(pi, pj) and _divides(pj, pi)):
            if _divides(pi, pj) and i < len(src):
                gi.append(i)
                pi, i = _times(pi, _factors(src[i])), i + 1
            elif _divides(pj, pi) and j < len(dst):
                gj.append(j)
                pj, j = _times(pj, _factors(dst[j])), j + 1
            else:
                return None
        groups.append((gi, gj))
    rest_src, rest_dst = list(range(i, len(src))), list(range(j, len(dst)))
    if not groups or not all(_is_one(src[k]) for k in rest_src) or not all(_is_one(dst[k]) for k in rest_dst):
        return None
    groups[-1] = (groups[-1][0] + rest_src, groups[-1][1] + rest_dst)
    return groups


def _index(groups: list, src: list, dst: list, out: tuple) -> list:
    """The input index of output index ``out``: per group, the output indices' row-major
    flat index unravelled in the group's input extents (the first needs no modulo)."""
    index: list[tirx.Expr | None] = [None] * len(src)
    for gi, gj in groups:
        flat = tirx.const(0, "int64")
        for j in gj:
            if not _is_one(dst[j]):  # the index on an extent-1 axis is 0
                flat = flat * dst[j] + out[j]
        for pos, i in enumerate(gi):
            inner = tirx.const(1, "int64")
            for k in gi[pos + 1:]:
                inner = inner * src[k]
            value = flat if pos == len(gi) - 1 else tirx.floordiv(flat, inner)
            index[i] = tirx.floormod(value, src[i]) if pos > 0 else value
    return index


def legalize_reshape(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``LegalizeOps`` entry for ``relax.reshape`` (see the module docstring)."""
    x, shape = call.args
    if isinstance(shape, relax.Var):
        shape = bb.lookup_binding(shape)
    src = list(x.ty.shape.values) if isinstance(x.ty.shape, relax.ShapeExpr) else None
    dst = list(shape.values) if isinstance(shape, relax.ShapeExpr) else None
    groups = group_axes(src, dst) if src is not None and dst is not None else None
    if groups is None:
        return bb.call_te(topi.reshape, x, shape, primfunc_name_hint="reshape")

    def compute(a: te.Tensor, new_shape: list) -> te.Tensor:
        src_, dst_ = list(a.shape), list(new_shape)  # the kernel's own vars for the extents
        return te.compute(dst_, lambda *out: a(*_index(groups, src_, dst_, out)), name="T_reshape",
                          tag="injective")

    return bb.call_te(compute, x, shape, primfunc_name_hint="reshape")


def legalize_reshape_flat_when_static(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """The legalization before static shapes were grouped: TOPI's flat index for every
    reshape of static shapes (``CompileOptions.static_reshapes_by_group=False``, to measure
    what grouping gains)."""
    x, shape = call.args
    shape = bb.lookup_binding(shape) if isinstance(shape, relax.Var) else shape
    dims = list(x.ty.shape.values) + list(shape.values) if isinstance(shape, relax.ShapeExpr) else []
    if dims and all(isinstance(d, tirx.IntImm) for d in dims):
        return bb.call_te(topi.reshape, x, shape, primfunc_name_hint="reshape")
    return legalize_reshape(bb, call)


__all__ = ["group_axes", "legalize_reshape", "legalize_reshape_flat_when_static"]
