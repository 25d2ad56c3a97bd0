"""CPU fallback rule: parallelize what TensorIR proves parallel, change nothing else.

It accepts any PrimFunc, including ones ``NormalizePrimFunc`` rejects (opaque blocks,
hand-written loops, extern calls).  For each block directly under the root it marks the
outermost loop parallel when every block beneath that loop binds the loop only to
data-parallel iterators.  ``Schedule.parallel`` re-checks the same condition (complete or
reduction blocks, affine bindings) and refuses otherwise, so the rule cannot create a race:
a refused loop is simply left serial.  It is the last CPU rule, after Gemm, Conv2d,
Reduction and Elementwise.
"""

from tvm import s_tir, tirx
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.target import Target

SBlockRV = s_tir.schedule.SBlockRV
LoopRV = s_tir.schedule.LoopRV

# Below this many iterations of the whole nest a parallel launch costs more than it saves.
MIN_PARALLEL_WORK = 4096


def is_cpu_target(target: Target) -> bool:
    """Whether the target is LLVM code for a CPU (the only target the CPU rules handle)."""
    return target.kind.name == "llvm"


def loop_extent(sch: s_tir.Schedule, loop: LoopRV) -> int | None:
    """The loop's constant extent, or None when it is symbolic."""
    extent = sch.get(loop).extent
    return int(extent.value) if isinstance(extent, tirx.IntImm) else None


def nest_work(sch: s_tir.Schedule, loop: LoopRV) -> int | None:
    """Statement instances executed by the nest under ``loop`` (None if symbolic)."""
    return _stmt_work(sch.get(loop))


def _stmt_work(stmt: tirx.Stmt) -> int | None:
    if isinstance(stmt, tirx.For):
        inner = _stmt_work(stmt.body)
        if not isinstance(stmt.extent, tirx.IntImm) or inner is None:
            return None
        return int(stmt.extent.value) * inner
    if isinstance(stmt, s_tir.SBlockRealize):
        return _stmt_work(stmt.block.body)
    if isinstance(stmt, tirx.SeqStmt):
        parts = [_stmt_work(s) for s in stmt.seq]
        return None if None in parts else sum(parts)
    return 1


def block_realize(sch: s_tir.Schedule, block: SBlockRV) -> s_tir.SBlockRealize | None:
    """The SBlockRealize of ``block`` (found in the body of its innermost loop)."""
    loops = sch.get_loops(block)
    if not loops:
        return None
    body = sch.get(loops[-1]).body
    stmts = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
    target = sch.get(block)
    for stmt in stmts:
        if isinstance(stmt, s_tir.SBlockRealize) and stmt.block.same_as(target):
            return stmt
    return None


def _uses_var(expr: tirx.Expr, var: tirx.Var) -> bool:
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))


def loop_kinds(sch: s_tir.Schedule, block: SBlockRV) -> str | None:
    """One letter per loop of ``block``: 'S' binds only spatial iterators (or none),
    'R' binds only reduction iterators, 'O' anything else.  None if the binding is unknown."""
    realize = block_realize(sch, block)
    if realize is None:
        return None
    kinds = []
    for loop in sch.get_loops(block):
        var = sch.get(loop).loop_var
        used = {
            int(iv.iter_type)
            for iv, value in zip(realize.block.iter_vars, realize.iter_values)
            if _uses_var(value, var)
        }
        if used <= {tirx.IterVar.DataPar}:
            kinds.append("S")
        elif used == {tirx.IterVar.CommReduce}:
            kinds.append("R")
        else:
            kinds.append("O")
    return "".join(kinds)


def try_parallel(sch: s_tir.Schedule, loop: LoopRV) -> bool:
    """Mark ``loop`` parallel if TensorIR proves it legal; True when it did."""
    try:
        sch.parallel(loop)
    except s_tir.ScheduleError:
        return False
    return True


def root_block(sch: s_tir.Schedule) -> SBlockRV | None:
    """The root block of the scheduled function, None if the body is not a block."""
    body = sch.mod["main"].body
    if not isinstance(body, s_tir.SBlockRealize):
        return None
    return sch.get_sblock(body.block.name_hint)


def leading_spatial_nest(sch: s_tir.Schedule, block: SBlockRV) -> list[LoopRV]:
    """The outer loops of ``block`` that bind only spatial iterators and nest perfectly."""
    kinds = loop_kinds(sch, block)
    if kinds is None:
        return []
    nest: list[LoopRV] = []
    for loop, kind in zip(sch.get_loops(block), kinds):
        if kind != "S" or sch.get(loop).kind != tirx.ForKind.SERIAL:
            break
        if nest and not sch.get(nest[-1]).body.same_as(sch.get(loop)):
            break
        nest.append(loop)
    return nest


class Fallback(ScheduleRule):
    """Fuse the outer spatial loops of every root-level block and parallelize them.

    Accepts every PrimFunc on a CPU target; one it cannot improve comes back unchanged
    (serial), which is still its default schedule.
    """

    def is_target_available(self, target: Target) -> bool:
        return is_cpu_target(target)

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        try:
            sch = s_tir.Schedule(func)
        except (s_tir.ScheduleError, ValueError, TypeError):
            return None  # not a TensorIR function (no blocks): nothing to schedule
        root = root_block(sch)
        if root is None:
            return sch
        for block in sch.get_child_blocks(root):
            loops = sch.get_loops(block)
            if not loops:
                continue
            work = nest_work(sch, loops[0])
            if work is not None and work < MIN_PARALLEL_WORK:
                continue
            nest = leading_spatial_nest(sch, block)
            if len(nest) > 1:
                nest = [sch.fuse(*nest)]
            try_parallel(sch, nest[0] if nest else loops[0])
        return sch
