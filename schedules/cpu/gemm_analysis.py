"""Recognise a GEMM-shaped reduction block and normalise it to ``C[S, M, N] += A[S, M, K] * B[S, N, K]``.

A block is GEMM-shaped when its body is ``C[...] = C[...] + A[...] * B[...]`` (a
multiply-accumulate of two loads, possibly through casts) with a zero init, and every
block iter plays one role (as in ``tvm.s_tir.dlight.gpu.matmul``):

* ``S`` (batch): spatial, read by both operands and written;
* ``I`` / ``J``: spatial, read by exactly one operand and written;
* ``K``: reduction, read by both operands, not written;
* ``T``: extent 1, ignored.

Operand indices may be affine expressions of the iters (``pad[c, y*2 + r, x*2 + s]`` in a
conv2d), which is how a convolution becomes an implicit GEMM: ``reindex`` materialises the
im2col buffer. The analysis only reads the block; :func:`normalize_gemm` rewrites the schedule
with ``reindex`` + ``transform_layout`` + ``transform_block_layout``, all of which TVM checks
for soundness, so a wrong guess here fails loudly instead of computing garbage.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from tvm import ir, s_tir, tirx
from tvm.runtime import DataType
from tvm.s_tir.schedule import SBlockRV
from tvm.sym.analyzer import Analyzer
from tvm.tirx.analysis import undefined_vars

# In TVM 0.27 `tirx.BufferLoad` is a constructor function; the node class lives in `tvm.ir`.
_Load = ir.TensorLoad


class IterRole(Enum):
    """The role a block iter plays in the GEMM."""

    S = "S"
    I = "I"
    J = "J"
    K = "K"
    T = "T"


@dataclass(frozen=True)
class GemmTraits:
    """Roles of a GEMM block's iters, per operand (in the operand's own index order)."""

    lhs: tuple[IterRole, ...]  # reads[0]'s iters, in block-iter order
    rhs: tuple[IterRole, ...]  # reads[1]'s iters
    out: tuple[IterRole, ...]  # the written buffer's iters
    block: tuple[IterRole, ...]
    extents: tuple[int | tirx.Expr, ...]  # extents of the block iters (symbolic: PrimExpr)

    def extent(self, role: IterRole) -> int | tirx.Expr:
        """Product of the extents of the iters with this role (1 when there is none)."""
        result = 1
        for r, e in zip(self.block, self.extents):
            if r == role:
                result = result * e
        return result

    def is_static(self, role: IterRole) -> bool:
        """Whether every iter of this role has a constant extent."""
        return all(isinstance(e, int) for r, e in zip(self.block, self.extents) if r == role)


def strip_cast(expr: tirx.Expr) -> tirx.Expr:
    while isinstance(expr, tirx.Cast):
        expr = expr.value
    return expr


def is_multiply_accumulate(block: s_tir.SBlock) -> bool:
    """Whether ``block`` computes ``C = C + A * B`` over two distinct input buffers, C init 0."""
    store = block.body
    if not isinstance(store, tirx.BufferStore) or block.init is None:
        return False
    init = block.init
    if not isinstance(init, tirx.BufferStore) or not isinstance(
        init.value, (tirx.FloatImm, tirx.IntImm)
    ):
        return False
    if init.value.value != 0 or not init.buffer.same_as(store.buffer):
        return False
    value = store.value
    if not isinstance(value, tirx.Add):
        return False
    acc, prod = strip_cast(value.a), strip_cast(value.b)
    if not isinstance(acc, _Load):
        acc, prod = prod, acc
    if not isinstance(acc, _Load) or not acc.source.same_as(store.buffer):
        return False
    if not isinstance(prod, tirx.Mul):
        return False
    lhs, rhs = strip_cast(prod.a), strip_cast(prod.b)
    return (
        isinstance(lhs, _Load)
        and isinstance(rhs, _Load)
        and not lhs.source.same_as(rhs.source)
        and not lhs.source.same_as(store.buffer)
        and not rhs.source.same_as(store.buffer)
    )


def _copied_load(block: s_tir.SBlock) -> _Load | None:
    """The load a block copies (``out[...] = in[...]``, possibly through casts), or None."""
    store = block.body
    if not isinstance(store, tirx.BufferStore) or block.init is not None or len(block.reads) != 1:
        return None
    value = strip_cast(store.value)
    return value if isinstance(value, _Load) else None


def _widens_narrow_int(block: s_tir.SBlock) -> bool:
    """``out[...] = float(in[...])`` with ``in`` a narrower integer buffer (a quantized weight)."""
    value = block.body.value
    if not isinstance(value, tirx.Cast) or not isinstance(value.value, _Load):
        return False
    src, dst = DataType(str(value.value.source.dtype)), DataType(str(value.ty.dtype))
    return str(src).startswith(("int", "uint")) and str(dst).startswith("float") and src.bits < dst.bits


def inline_dequantized_operand(sch: s_tir.Schedule, main: SBlockRV) -> bool:
    """Inline into ``main`` the copy chain (a transpose, ...) that casts a narrow integer
    buffer to float for one of its operands, so the GEMM reads the integer buffer and casts
    in registers: the operand's copy (``normalize_gemm``'s reindex, a prepacked weight)
    then holds the narrow integers, not 4x the bytes of floats. Whether it inlined one."""
    for producer in sch.get_producers(main):
        chain, block = [], producer
        while True:
            stmt = sch.get(block)
            if _copied_load(stmt) is None:
                break
            chain.append(block)
            if _widens_narrow_int(stmt):
                for member in chain:
                    sch.compute_inline(member)
                return True
            feeding = sch.get_producers(block)
            if len(feeding) != 1:
                break
            block = feeding[0]
    return False


def _is_affine(expr: tirx.Expr) -> bool:
    """Sums of (constant multiples of) iters: what im2col-style reindexing handles soundly.

    A grouped convolution indexes the input with ``f // 4 * 2 + c``; reindexing that would
    replicate the input per output channel, so it is refused here until ``Conv2d`` has
    split ``f`` into (group, channel in group).
    """
    if isinstance(expr, (tirx.Var, tirx.IntImm)):
        return True
    if isinstance(expr, (tirx.Add, tirx.Sub)):
        return _is_affine(expr.a) and _is_affine(expr.b)
    if isinstance(expr, tirx.Mul):
        return (isinstance(expr.a, tirx.IntImm) and _is_affine(expr.b)) or (
            isinstance(expr.b, tirx.IntImm) and _is_affine(expr.a)
        )
    return False


def _region_vars(region, analyzer: Analyzer) -> set[tirx.Var] | None:
    """The iters a point access reads, its indices simplified within the iters' domains
    (a grouped conv split into (group, channel) reads ``(g * F_g + f) // F_g * C_g + c``,
    which is ``g * C_g + c``: ``reindex`` simplifies it the same way)."""
    result: set[tirx.Var] = set()
    for rng in region:
        if not (isinstance(rng.extent, tirx.IntImm) and rng.extent.value == 1):
            return None
        index = analyzer.simplify(rng.min)
        if not _is_affine(index):
            return None
        result |= set(undefined_vars(index))
    return result


def detect_gemm(block: s_tir.SBlock) -> GemmTraits | None:
    """The GEMM roles of ``block``'s iters, or None when it is not a GEMM.

    Extents may be symbolic (``batch * seq`` rows); the rule decides which roles may be.
    """
    if len(block.reads) != 2 or len(block.writes) != 1 or not is_multiply_accumulate(block):
        return None
    analyzer = Analyzer()
    for iv in block.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    lhs_vars = _region_vars(block.reads[0].region, analyzer)
    rhs_vars = _region_vars(block.reads[1].region, analyzer)
    out_vars = _region_vars(block.writes[0].region, analyzer)
    if lhs_vars is None or rhs_vars is None or out_vars is None:
        return None
    roles: dict[tirx.Var, IterRole] = {}
    extents: list[int] = []
    for iv in block.iter_vars:
        var, extent = iv.var, iv.dom.extent
        if not isinstance(iv.dom.min, tirx.IntImm) or iv.dom.min.value != 0:
            return None
        static = isinstance(extent, tirx.IntImm)
        extents.append(extent.value if static else extent)
        in_l, in_r, in_o = var in lhs_vars, var in rhs_vars, var in out_vars
        if static and extent.value == 1:
            role = IterRole.T
        elif iv.iter_type == tirx.IterVar.DataPar and in_o:
            if in_l and in_r:
                role = IterRole.S
            elif in_l:
                role = IterRole.I
            elif in_r:
                role = IterRole.J
            else:
                return None
        elif iv.iter_type == tirx.IterVar.CommReduce and in_l and in_r and not in_o:
            role = IterRole.K
        else:
            return None
        roles[var] = role
    present = set(roles.values())
    # M or N may be 1 (a GEMV written as matmul); K and one of them must remain
    if IterRole.K not in present or not present & {IterRole.I, IterRole.J}:
        return None
    order = [iv.var for iv in block.iter_vars]
    return GemmTraits(
        lhs=tuple(roles[v] for v in order if v in lhs_vars),
        rhs=tuple(roles[v] for v in order if v in rhs_vars),
        out=tuple(roles[v] for v in order if v in out_vars),
        block=tuple(roles[v] for v in order),
        extents=tuple(extents),
    )


def _fusion_map(
    roles: tuple[IterRole, ...], extents: list[int | tirx.Expr], order: list[IterRole]
) -> tirx.IndexMap:
    """Index map fusing the iters of each role (row-major) into one axis per role in ``order``."""
    fused: dict[IterRole, tirx.Expr] = {}
    inputs = []
    for i, (role, extent) in enumerate(zip(roles, extents)):
        var = tirx.Var(f"i{i}", "int64")
        inputs.append(var)
        if role == IterRole.T:
            continue
        size = tirx.IntImm("int64", extent) if isinstance(extent, int) else tirx.Cast("int64", extent)
        fused[role] = fused[role] * size + var if role in fused else var
    return tirx.IndexMap(inputs, [fused.get(r, tirx.IntImm("int64", 0)) for r in order], None)


@dataclass(frozen=True)
class NormalizedGemm:
    """The copy blocks around a normalised GEMM block.

    An *im2col* operand (read at compound indices, e.g. a conv input) is stored K-major,
    ``[S, K, rows]``, and its copy keeps the original iters, reordered ``S, K, rows``: the
    innermost loop then walks one input row, contiguous on both sides for stride 1, where a
    fused ``rows`` iter would cost a div/mod per element.
    """

    a_copy: SBlockRV
    b_copy: SBlockRV
    c_copy: SBlockRV
    a_im2col: bool
    b_im2col: bool


def _is_plain_region(region) -> bool:
    return all(isinstance(rng.min, (tirx.Var, tirx.IntImm)) for rng in region)


def normalize_gemm(
    sch: s_tir.Schedule, block: SBlockRV, traits: GemmTraits, vector_role: IterRole
) -> NormalizedGemm:
    """Rewrite ``block`` into ``C'[S, M, N] += A'[S, M, K] * B'[S, N, K]``.

    ``vector_role`` (``I`` or ``J``) becomes N, the axis the kernel vectorises; the other
    becomes M. Im2col operands are stored ``[S, K, M]`` / ``[S, K, N]`` instead.
    """
    m_role = IterRole.I if vector_role == IterRole.J else IterRole.J
    im2col = [not _is_plain_region(sch.get(block).reads[i].region) for i in (0, 1)]
    re_lhs = sch.reindex(block, ("read", 0))
    re_rhs = sch.reindex(block, ("read", 1))
    re_out = sch.reindex(block, ("write", 0))
    # The block now reads/writes each reindex buffer at plain iters (reindex drops iters
    # that simplify away, e.g. the unit channel of a depthwise conv), so take the roles
    # of the reindexed dims from those indices rather than from the original accesses.
    stmt = sch.get(block)
    info = list(zip(stmt.iter_vars, traits.block, traits.extents))

    def dims(region) -> tuple[tuple[IterRole, ...], list[int | tirx.Expr]]:
        found = [next((r, e) for iv, r, e in info if iv.var.same_as(rng.min)) for rng in region]
        return tuple(r for r, _ in found), [e for _, e in found]

    S, I, J, K = IterRole.S, IterRole.I, IterRole.J, IterRole.K
    for blk, region, order, io, keep_iters in (
        (
            re_lhs,
            stmt.reads[0].region,
            [S, K, I] if im2col[0] else [S, I, K],
            ("write", 0),
            im2col[0],
        ),
        (
            re_rhs,
            stmt.reads[1].region,
            [S, K, J] if im2col[1] else [S, J, K],
            ("write", 0),
            im2col[1],
        ),
        (re_out, stmt.writes[0].region, [S, m_role, vector_role], ("read", 0), False),
    ):
        roles, extents = dims(region)
        index_map = _fusion_map(roles, extents, order)
        sch.transform_layout(blk, io, index_map)
        if keep_iters:
            rank = {IterRole.T: 0, S: 1, K: 2, I: 3, J: 3}
            loops = sch.get_loops(blk)
            sch.reorder(
                *[loops[i] for i in sorted(range(len(roles)), key=lambda i: rank[roles[i]])]
            )
        else:
            sch.transform_block_layout(blk, index_map)
    sch.transform_block_layout(
        block, _fusion_map(traits.block, list(traits.extents), [S, m_role, vector_role, K])
    )
    if m_role == I:
        return NormalizedGemm(re_lhs, re_rhs, re_out, im2col[0], im2col[1])
    return NormalizedGemm(re_rhs, re_lhs, re_out, im2col[1], im2col[0])
