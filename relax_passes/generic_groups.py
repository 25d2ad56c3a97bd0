"""The generic grouping of FuseEmits: what no library candidate took, swept into groups.

In one topological sweep, elementwise, broadcast, injective and view Emits join the group
of a producer (``fused_elementwise``); an elementwise epilogue joins a reduction, pool,
norm, GEMM or convolution group, a library group included; an elementwise group followed
by a reduction-like Emit becomes that Emit's prologue.

A producer may have several consumers (the tanh-GELU reads the GEMM output three times):
a join is provisional until the group's values are known to stay inside it. A group is
*closed* once one of its values is needed outside it for sure (a decided consumer
elsewhere, a block output): the last member of a group is always one of its outputs, so
a closed group can take no more members without a second output. At the end of a sweep
each group is rolled back, newest joins first, to its longest prefix with one output
that is convex (every prefix is a state the sweep passed through; its first member, or
the library match, is always kept). Rolled-back members are swept again among
themselves, into fresh groups only; the released set shrinks every round, so it ends.

A group passes through an order-keeping view between its members (Linear's
``[B * S, N] -> [B, S, N]`` between a GEMM and its epilogue) when the view's element count
is proven equal for every binding of the symbolic dims, and when the group's inputs define
every var the view's target shape names (the group's function must not have free vars);
a group rolled back for the latter is reported.

Sound because a group's function inlines its members' bodies in program order (each
intermediate in its own dtype): joining changes where values live, never what is
computed; convexity and effects are judged on the final members.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

import tvm
from tvm import relax

from aicf_tvm.core.emit_graph import EmitGraph, Node
from aicf_tvm.core.kinds import registry as K
from aicf_tvm.core.report import Decision, FusionReport

from .group_rewrite import Group, group_inputs
from .lift_emits import defined_vars

EPILOGUE = {K.ELEMENTWISE, K.BROADCAST}
CHAINABLE = {K.ELEMENTWISE, K.BROADCAST, K.INJECTIVE, K.VIEW}
ANCHORS = {K.REDUCTION, K.POOL, K.NORM, K.SOFTMAX, K.MATMUL, K.CONV}
LIBRARY = "library"
STRUCTURAL = "structural"  # EmitGraph's category of a plain (non-Emit) binding

# Plain view bindings left in the block by EliminateEmits (a reshape of contiguous
# storage): pure Relax ops a library match may take as members, so a pattern sees through
# them (e.g. the head split of attention).
STRUCTURAL_VIEWS = frozenset({"relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.permute_dims",
                              "relax.broadcast_to"})
# Those that keep the row-major element order: a group may pass through one (Linear's
# [B*S, N] -> [B, S, N] between its GEMM and the activation) but never ends with one,
# since outside a group the view costs nothing.
_ORDER_KEEPING_VIEWS = frozenset({"relax.reshape", "relax.expand_dims", "relax.squeeze"})


def is_structural_view(node: Node) -> bool:
    """Whether ``node`` is a plain (non-Emit) view op binding of a tensor."""
    v = node.value
    return (node.emit is None and isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)
            and v.op.name in STRUCTURAL_VIEWS and isinstance(node.var.ty, relax.TensorType))


def _is_passable_view(node: Node) -> bool:
    """An order-keeping view of a known shape that provably keeps the element count: the
    group may pass through it (its target shape's vars are checked on the whole group,
    ``undefined_view_vars``)."""
    shape = node.var.ty.shape if isinstance(node.var.ty, relax.TensorType) else None
    return (is_structural_view(node) and node.value.op.name in _ORDER_KEEPING_VIEWS and shape is not None
            and keeps_element_count(node.value))


def _dims(ty: relax.Type) -> str:
    """A tensor type's dims as the report shows shapes (``[bxsx24]``)."""
    shape = getattr(ty, "shape", None)
    if not isinstance(shape, relax.ShapeExpr):
        return "[?]"
    dims = (str(int(d)) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in shape.values)
    return f"[{'x'.join(dims)}]"


def _is_unproven_reshape(node: Node) -> bool:
    return (is_structural_view(node) and node.value.op.name == "relax.reshape"
            and not keeps_element_count(node.value))


def keeps_element_count(call: relax.Call) -> bool:
    """Whether a view call provably has as many elements out as in, for every binding of
    the symbolic dims. Relax accepts a reshape of ``[m, k]`` to ``[b, s, k]`` unless the
    counts provably differ; a group's kernel walks the view's elements as its producer's
    (a GEMM's rows as ``[b, s]``), which is the same computation only when the counts are
    equal, so a count not proven equal keeps the reshape outside."""
    if call.op.name != "relax.reshape":
        return True  # expand_dims and squeeze derive their shape from the input's
    src, dst = call.args[0].ty, call.ty
    if not isinstance(src, relax.TensorType) or src.shape is None or dst.shape is None:
        return False
    one = tvm.tirx.IntImm("int64", 1)
    count = [functools.reduce(operator.mul, t.shape.values, one) for t in (src, dst)]
    return bool(tvm.sym.Analyzer().can_prove_equal(*count))


def undefined_view_vars(graph: EmitGraph, members: list[int]) -> list[tvm.tirx.Var]:
    """The symbolic vars member views' target shapes name (``[batch, seq, n]``) that the
    group function's parameters leave undefined (not a whole extent of a boundary input).

    The group's function re-emits the view with that shape; a var its parameters do not
    define (they may only have the compound ``batch * seq`` of the GEMM's input) would be
    free in it. A defined var is bound at every call to the caller's value of it, so the
    view computes what it computed outside, for every binding of the dims."""
    views = [graph.nodes[i] for i in members if is_structural_view(graph.nodes[i])]
    named = [v for node in views for a in node.value.args if isinstance(a, relax.ShapeExpr)
             for d in a.values for v in tvm.tirx.analysis.undefined_vars(d)]
    if not named:
        return []
    defined = defined_vars([a.ty for a in group_inputs(graph, members)])
    out: list[tvm.tirx.Var] = []
    for v in named:
        if not any(v.same_as(d) for d in defined + out):
            out.append(v)
    return out


class GenericGrouping:
    """Sweeps, closes and rolls back groups; ``groups[:n_library]`` are library matches."""

    def __init__(self, graph: EmitGraph, groups: list[Group], taken: dict[int, int]) -> None:
        self.graph, self.groups, self.taken = graph, groups, taken
        self.n_library = len(groups)
        self.anchor_cat: dict[int, str] = {k: LIBRARY for k in range(len(groups))}
        self.base: dict[int, int] = {k: len(g.members) for k, g in enumerate(groups)}
        self.prologue_at: dict[int, int] = {}  # group -> member count when a reduction joined
        self.closed: set[int] = set()
        self.refusals: list[Decision] = []  # joins rolled back for a view's free vars

    def run(self) -> list[Group]:
        todo = [n.index for n in self.graph.nodes]
        open_groups = set(range(len(self.groups)))
        while todo:
            self._sweep(todo, open_groups)
            released: list[int] = []
            for k in sorted(open_groups):
                released += self._roll_back(k)
            todo, open_groups = sorted(released), set()
        return self.groups

    def _join_as(self, cat: str, k: int, n_producers: int) -> str | None:
        """The category group ``k`` has once a ``cat`` Emit joins it; None: it may not."""
        acat = self.anchor_cat[k]
        if cat == STRUCTURAL:
            return acat
        if acat in ANCHORS or acat == LIBRARY:
            return acat if cat in EPILOGUE else None
        if acat == K.ELEMENTWISE and cat in ANCHORS - {K.MATMUL, K.CONV} and n_producers == 1:
            return cat  # an elementwise prologue of a reduction
        return acat if cat in CHAINABLE else None

    def _target(self, node, open_groups: set[int]) -> int | None:
        """The open group ``node`` joins (the first producer's that takes it), or a new one."""
        for p in node.producers:
            k = self.taken.get(p)
            if k is None or k not in open_groups or k in self.closed:
                continue
            cat = self._join_as(node.category, k, len(node.producers))
            if cat is not None:
                if cat != self.anchor_cat[k]:
                    self.prologue_at[k], self.anchor_cat[k] = len(self.groups[k].members), cat
                return k
        if node.category not in CHAINABLE and node.category not in ANCHORS:
            return None
        k = len(self.groups)
        self.anchor_cat[k] = K.ELEMENTWISE if node.category in CHAINABLE else node.category
        self.base[k] = 1
        self.groups.append(Group([], ""))
        open_groups.add(k)
        return k

    def _sweep(self, todo: list[int], open_groups: set[int]) -> None:
        nodes, taken, pending = self.graph.nodes, self.taken, set(todo)
        for i in todo:
            node = nodes[i]
            if i not in taken and self._is_groupable(node):
                k = self._target(node, open_groups)
                if k is not None:
                    taken[i] = k
                    self.groups[k].members.append(i)
            elif i not in taken and any(p in taken for p in node.producers) and _is_unproven_reshape(node):
                src, dst = (_dims(t) for t in (node.value.args[0].ty, node.var.ty))
                self.refusals.append(Decision("epilogue", (node.var.name,), False, note=(
                    f"reshape {src} -> {dst}: equal element counts not proven for every binding")))
            # i is decided: a group that holds a producer but not i has an output for sure,
            # and so has i's group when i is a block output or a consumer is decided elsewhere
            for p in node.producers:
                if p in taken and taken[p] != taken.get(i):
                    self.closed.add(taken[p])
            if i in taken and (node.escapes or any(c not in pending for c in node.consumers)):
                self.closed.add(taken[i])

    @staticmethod
    def _is_groupable(node) -> bool:
        if _is_passable_view(node):
            return True
        return (node.emit is not None and not node.is_opaque and node.category != "fused"
                and isinstance(node.var.ty, relax.TensorType))  # tuple results stay their own Emit

    def _roll_back(self, k: int) -> list[int]:
        """Drop group ``k``'s newest joins until it has one output, is convex, does not
        end with a view and names no symbolic var its parameters leave undefined."""
        members, released = self.groups[k].members, []
        free = undefined_view_vars(self.graph, members)
        if free and not self._settled(members, views=False):
            free = []  # rolled back for another reason first: not the view's vars to report
        while len(members) > self.base[k] and not self._settled(members):
            released.append(members.pop())
            del self.taken[released[-1]]
            if self.prologue_at.get(k) == len(members):
                self.anchor_cat[k] = K.ELEMENTWISE
        self.closed.add(k)
        if free and released:
            names = tuple(self.graph.nodes[i].var.name for i in reversed(released))
            self.refusals.append(Decision("epilogue", names, False, note=(
                f"a view names {', '.join(v.name for v in free)}, which no input of the group defines")))
        return released

    def _settled(self, members: list[int], views: bool = True) -> bool:
        return (len(self.graph.outputs_of(members)) == 1 and self.graph.is_convex(members)
                and not _is_passable_view(self.graph.nodes[members[-1]])
                and not (views and undefined_view_vars(self.graph, members)))

    def joined(self, k: int) -> list[int]:
        """The members the sweep added to library group ``k``."""
        return self.groups[k].members[self.base[k]:]


def finish_groups(grouping: GenericGrouping, report: FusionReport,
                  judge: Callable[[Group], Decision], make_emit: Callable[[str], object]) -> list[Group]:
    """Name, judge and report the groups; drop single members and refused groups."""
    graph, out = grouping.graph, []
    for decision in grouping.refusals:
        report.add(decision)
    for k, g in enumerate(grouping.groups):
        if len(g.members) < 2:
            continue
        if k < grouping.n_library:
            joined = grouping.joined(k)
            if joined:
                head = [graph.nodes[i].var.name for i in g.members[:grouping.base[k]]]
                report.add(Decision("epilogue", tuple(graph.nodes[i].var.name for i in joined), True,
                                    note=f"joins {g.name} [{', '.join(head)}]"))
        else:
            g.name = "fused_elementwise" if grouping.anchor_cat[k] == K.ELEMENTWISE else "fused_reduce_epilogue"
            decision = judge(g)
            report.add(decision)
            if not decision.accepted:
                continue
            g.make_emit = make_emit(g.name)
        out.append(g)
    return out
