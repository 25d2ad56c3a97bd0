"""The fusion planner of FuseEmits: which Emits of one block become one library or
generic Emit, judged on the facts, with every decision in the report.

1. Library candidates (``aicf_tvm.library``): ``relax.dpl`` patterns matched on the
   op-level view of the DAG (``op_view``: each single-op Emit call seen as the op it wraps).
2. Each match S is judged (``aicf_tvm.core.legality``): convex (a match that is not
   first gives back the shared view chains on its input side, which a pattern's longest
   view chain took in: ``FusionPlanner._without_shared_input_views``); no opaque member
   and no effectful Emit inside its span touching its values; ``F ⊢ Requires(E*)``
   on boundary facts; ``Provides(E*) ⊑ Provides(S)`` on numerics. Every verdict goes
   to the report with the failing component and both lattice values.
3. ``plan`` takes legal matches by benefit (intermediate bytes removed), never two that
   overlap: sorting makes it O(n log n) in the number of matches.
4. What is left is grouped generically (``generic_groups``).

MaterializeEmits asks the same planner for the refused matches (``judged_matches``) to
find the ones an inserted Emit would make legal.
"""

from __future__ import annotations

from typing import Any

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax import dpl

from aicf_tvm.core.candidate import Candidate, Match
from aicf_tvm.core.contract import ContractFacts, EmitContract, PortFacts
from aicf_tvm.core.emit import Emit, Interface, Port
from aicf_tvm.core.emit_graph import EmitGraph
from aicf_tvm.core.facts import FactTable
from aicf_tvm.core.kinds.transfer import ALLOC_ALIGN, abi_of, fresh_shape
from aicf_tvm.core.lattice import Effect, ShapeFact
from aicf_tvm.core.legality import (
    derived_numeric,
    effect_failures,
    numeric_failures,
    requires_failures,
)
from aicf_tvm.core.report import Decision, FusionReport

from .generic_groups import STRUCTURAL_VIEWS, GenericGrouping, finish_groups, is_structural_view
from .group_rewrite import ACCUMULATING, Group

# Views a match may give back at its input side (``FusionPlanner._without_shared_input_views``).
SHARED_INPUT_VIEWS = STRUCTURAL_VIEWS | {"relax.strided_slice"}

K_READ, K_WRITE = Effect("Read"), Effect("Write")


def op_view(graph: EmitGraph) -> tuple[dict, dict]:
    """var -> op-level call (params replaced by the call's args); call id -> node."""
    var2val, call_node = {}, {}
    for node in graph.nodes:
        if is_structural_view(node):
            var2val[node.var] = node.value
            call_node[node.value] = node.index
            continue
        if node.body is None or node.is_opaque or not isinstance(node.var.ty, relax.TensorType):
            continue
        func = graph.mod[node.callee]
        sub = {p: a for p, a in zip(func.params, node.value.args)}

        def subst(e, sub=sub):  # called in this iteration only
            if isinstance(e, relax.Var) and e in sub:
                return sub[e]
            if isinstance(e, relax.Tuple):
                return relax.Tuple([subst(f) for f in e.fields])
            return e

        call = relax.Call(node.body.op, [subst(a) for a in node.body.args], node.body.attrs, node.body.ty_args)
        var2val[node.var] = call
        call_node[call] = node.index
    return var2val, call_node


def _root_ops(pattern: dpl.DFPattern) -> frozenset | None:
    """The ops a match of ``pattern`` can be rooted at; None when any (a wildcard)."""
    if hasattr(pattern, "left"):  # an OrPattern
        left, right = _root_ops(pattern.left), _root_ops(pattern.right)
        return None if left is None or right is None else left | right
    op = getattr(getattr(pattern, "op", None), "expr", None)
    name = getattr(op, "name", None)
    return None if name is None else frozenset({name})


def value_bytes(var: relax.Expr) -> int:
    """The bytes of a tensor value of static shape; 0 when its shape is not static."""
    ty = var.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return 0
    n = 1
    for d in ty.shape.values:
        if not isinstance(d, tvm.tirx.IntImm):
            return 0
        n *= int(d.value)
    return n * max(1, tvm.runtime.DataType(str(ty.dtype)).bits // 8)


class FusionPlanner:
    """The fusion decisions for one block: library matches judged and taken by benefit,
    then generic groups of what is left (see the module docstring)."""

    def __init__(self, graph: EmitGraph, table: FactTable, candidates, report: FusionReport) -> None:
        self.graph, self.table, self.candidates, self.report = graph, table, candidates, report

    # -- library candidates ---------------------------------------------------------
    def judged_matches(self) -> list[tuple[Decision, Match]]:
        """Per root and candidate, the first legal variant (most specific first), or the
        first refused one when none is legal."""
        var2val, call_node = op_view(self.graph)
        # one FFI map for every match below: a Python dict is converted at each call
        var2val_map = tvm_ffi.Map(var2val) if var2val else None
        found = []
        for node in reversed(self.graph.nodes):
            root = var2val.get(node.var)
            if root is None:
                continue
            for cand in self.candidates:
                first_refusal = None
                seen: set = set()
                for pattern, roles, ops in _variants(cand):
                    if ops is not None and root.op.name not in ops:
                        continue
                    got = pattern.extract_matched_expr(root, var2val_map)
                    m = None if got is None else self._make_match(cand, node.index, roles, got, call_node)
                    if m is not None and not self.graph.is_convex(m.members):
                        m = self._without_shared_input_views(m) or m
                    if m is None or (m.members, tuple(sorted(m.roles))) in seen:
                        continue
                    seen.add((m.members, tuple(sorted(m.roles))))
                    decision = self.judge(m)
                    if decision.accepted:
                        found.append((decision, m))
                        break
                    first_refusal = first_refusal or (decision, m)
                else:
                    if first_refusal is not None:
                        found.append(first_refusal)
        return found

    def _make_match(self, cand: Candidate, root: int, roles: dict, got: dict, call_node: dict) -> Match | None:
        members, matched, role_nodes = set(), {}, {}
        for pat, expr in got.items():
            # an OrPattern stands for the alternative it matched, which may be a wildcard
            if not isinstance(pat, (dpl.WildcardPattern, dpl.OrPattern)) and expr in call_node:
                members.add(call_node[expr])
        for role, pat in roles.items():
            expr = got.get(pat)
            if expr is None:
                continue
            if expr in call_node:  # an op call: a member, or a boundary value seen through
                index = call_node[expr]
                if index in members:
                    role_nodes[role] = index
                    matched[role] = expr
                else:
                    matched[role] = self.graph.nodes[index].var
            else:
                matched[role] = expr
        if len(members) < 2:
            return None
        m = Match(cand, root, tuple(sorted(members)), matched, role_nodes)
        for role, expr in matched.items():
            shape = self._shape_of(self.graph.nodes[role_nodes[role]].var if role in role_nodes else expr)
            if shape is not None:
                m.shapes[role] = shape
        return m

    def _shape_of(self, var: relax.Expr) -> ShapeFact | None:
        """The propagated shape fact of a tensor value, or None."""
        if not isinstance(getattr(var, "ty", None), relax.TensorType):
            return None
        fact = self.table.tensor(var)
        return None if fact is None else fact.facts.shape

    def _is_view(self, index: int) -> bool:
        """Whether node ``index`` is a view (an Emit wrapping one, or a plain view binding)."""
        node = self.graph.nodes[index]
        call = node.body if node.body is not None else node.value
        return getattr(getattr(call, "op", None), "name", None) in SHARED_INPUT_VIEWS

    def _view_prefix(self, index: int, members: set[int]) -> set[int] | None:
        """Node ``index`` and its producers among ``members``, recursively, when every one
        is a view; None otherwise."""
        out: set[int] = set()
        pending = [index]
        while pending:
            j = pending.pop()
            if not self._is_view(j):
                return None
            out.add(j)
            pending.extend(p for p in self.graph.nodes[j].producers if p in members and p not in out)
        return out

    def _without_shared_input_views(self, m: Match) -> Match | None:
        """``m`` less the view chains on its input side that values outside it also read,
        when that makes it convex; None otherwise.

        A pattern takes the longest view chain to an operand, so a view the graph shares
        joins the match: ModernBERT reshapes its packed q/k/v twice, v's chain reaches both
        reshapes, and q and k leave the second through the rotary embedding and come back
        at the scores, a path out of the match and in again.  Without the shared view and
        the views before it, the match reads the shared view's result as the operand: the
        same values through fewer views.  Refused (None) when a trimmed view is a role,
        when the trimmed chain reads more than one value or one that is not a boundary
        role, or when a member still reads a trimmed value other than the shared one."""
        members = set(m.members)
        roles, shapes = dict(m.roles), dict(m.shapes)
        while not self.graph.is_convex(members):
            chains = ((i, self._view_prefix(i, members)) for i in sorted(members)
                      if i != m.root and self._is_view(i)
                      and any(c not in members for c in self.graph.nodes[i].consumers))
            shared, chain = next(((i, c) for i, c in chains if c is not None), (None, None))
            if chain is None or any(j in chain for j in m.role_nodes.values()):
                return None
            members -= chain
            var = self.graph.nodes[shared].var
            chain_vars = {self.graph.nodes[j].var for j in chain}
            read = {v for j in chain for v in relax.analysis.free_vars(self.graph.nodes[j].value)} - chain_vars
            boundary = [r for r, e in roles.items() if r not in m.role_nodes and any(e.same_as(v) for v in read)]
            if len(read) != 1 or len(boundary) != 1:
                return None
            hidden = (chain_vars | read) - {var}
            if any(v in hidden for j in members for v in relax.analysis.free_vars(self.graph.nodes[j].value)):
                return None
            roles[boundary[0]] = var
            shapes.pop(boundary[0], None)
            if (shape := self._shape_of(var)) is not None:
                shapes[boundary[0]] = shape
        if len(members) < 2:
            return None
        return Match(m.candidate, m.root, tuple(sorted(members)), roles, dict(m.role_nodes), shapes)

    def ports_of(self, m: Match) -> dict[str, relax.Expr]:
        return {r: e for r, e in m.roles.items() if r not in m.role_nodes}

    def judge(self, m: Match) -> Decision:
        names = tuple(self.graph.nodes[i].var.name for i in m.members)
        label = m.candidate.name
        if not self.graph.is_convex(m.members):
            return Decision(label, names, False, note="not convex: a path leaves the subgraph and re-enters")
        fails, note = effect_failures(self.graph, list(m.members))
        if not fails:
            note = m.candidate.check(m) or ""
        if not fails and not note:
            fails = requires_failures(self.table, self.ports_of(m), m.candidate.requires(m), label)
            fails += self._numeric(m.members, m.candidate.accumulation)
        return Decision(label, names, not fails and not note, tuple(fails), note, self._benefit(m.members))

    def _numeric(self, members, accumulation):
        accumulating = [i for i in members if self.graph.nodes[i].body is not None
                        and self.graph.nodes[i].body.op.name in ACCUMULATING]
        outputs = sorted(set(accumulating) | set(self.graph.outputs_of(members)))
        if accumulation is None:
            return []
        return numeric_failures(self.table, self.graph, outputs, accumulation)

    def _benefit(self, members) -> int:
        outs = set(self.graph.outputs_of(members))
        saved = sum(value_bytes(self.graph.nodes[i].var) for i in members if i not in outs)
        return saved + 4096 * (len(members) - 1)

    # -- planning -------------------------------------------------------------------
    def plan(self) -> list[Group]:
        taken: dict[int, int] = {}
        groups: list[Group] = []
        judged = self.judged_matches()
        judged.sort(key=lambda dm: (-dm[0].accepted, -dm[1].candidate.priority, -dm[0].benefit, dm[1].root))
        for decision, m in judged:
            if decision.accepted and any(i in taken for i in m.members):
                other = groups[taken[next(i for i in m.members if i in taken)]]
                decision = Decision(decision.candidate, decision.members, False,
                                    note=f"overlaps {other.name}, taken first")
            self.report.add(decision)
            if decision.accepted:
                for i in m.members:
                    taken[i] = len(groups)
                groups.append(self._library_group(m))
        return self._generic(groups, taken)

    def _library_group(self, m: Match) -> Group:
        ports = list(self.ports_of(m).items())
        attrs = _config(m)
        g = Group(list(m.members), m.candidate.kind, accumulation=m.candidate.accumulation)
        g.make_emit = lambda ins, outs, graph: self._emit(m.candidate.kind, attrs, ins, outs, ports,
                                                          m.candidate.requires(m), m.candidate.accumulation)
        return g

    def _generic(self, groups: list[Group], taken: dict[int, int]) -> list[Group]:
        grouping = GenericGrouping(self.graph, groups, taken)
        grouping.run()
        return finish_groups(grouping, self.report, self._judge_generic, self._generic_emit)

    def _judge_generic(self, g: Group) -> Decision:
        names = tuple(self.graph.nodes[i].var.name for i in g.members)
        if not self.graph.is_convex(g.members):
            return Decision(g.name, names, False, note="not convex")
        fails, note = effect_failures(self.graph, g.members)
        return Decision(g.name, names, not fails, tuple(fails), note, self._benefit(g.members))

    def _generic_emit(self, kind: str):
        return lambda ins, outs, graph: self._emit(kind, {}, ins, outs, [], ContractFacts(), None)

    # -- Derive -----------------------------------------------------------------------
    def _emit(self, kind, attrs, inputs, outputs, role_of, requires: ContractFacts, acc) -> Emit:
        """Contract(E*) = Derive(F): boundary facts, effects Read/Write, derived numerics."""
        graph, table = self.graph, self.table
        in_ports, out_ports, provides = [], [], {}
        used: set[str] = set()
        for i, expr in enumerate(inputs):
            name = next((r for r, e in role_of if e.same_as(expr)), None) or f"in{i}"
            name = name if name not in used else f"{name}{i}"
            used.add(name)
            ty = expr.ty
            in_ports.append(Port(name, str(ty.dtype), ty.ndim))
            facts = table.port_facts(expr)
            provides[name] = PortFacts(K_READ, facts.shape, facts.numeric, facts.abi)
        out_ty = [graph.nodes[i].var for i in outputs]
        for j, var in enumerate(out_ty):
            name = "out" if len(out_ty) == 1 else f"out.{j}"
            out_ports.append(Port(name, str(var.ty.dtype), var.ty.ndim))
            facts = table.port_facts(var)
            # E* writes its outputs into fresh buffers, in the layout S wrote them
            shape = fresh_shape(var.ty).with_layout(facts.shape.layout)
            provides[name] = PortFacts(K_WRITE, shape, derived_numeric(facts.numeric, acc), abi_of(shape, ALLOC_ALIGN))
        req = {n: p for n, p in requires.ports if n in provides}
        return Emit(kind, attrs, Interface(tuple(in_ports), tuple(out_ports)),
                    EmitContract(ContractFacts.of(req), ContractFacts.of(provides)), op="")


def _variants(cand: Candidate) -> list:
    """The candidate's patterns with their roles and root ops, built once per variants
    function (held, so never reused)."""
    cache = _VARIANTS.get(cand.variants)
    if cache is None:
        cache = _VARIANTS[cand.variants] = [(p, roles, _root_ops(p)) for p, roles in cand.variants()]
    return cache


_VARIANTS: dict = {}


def _config(m: Match) -> dict:
    """Configuration attrs accumulated from the members (seed §4: attrs_new = derive(∨ attrs_i))."""
    out: dict[str, Any] = {}
    if m.has("act"):
        out["activation"] = m.roles["act"].op.name.rsplit(".", 1)[-1]
    elif m.has("post_act"):
        out["activation"] = "relu"
    for flag in ("bias", "residual", "mask", "scale", "gamma", "beta", "transpose_b"):
        if flag in m.roles or f"{flag}_add" in m.roles:
            out[f"has_{flag}"] = True
    if m.has("scale_q") or m.has("scale_k"):  # attention's √scale on q and/or kᵀ
        out["has_scale"] = True
    if m.has("safe"):
        out["safe_softmax"] = True
    if m.has("post_act"):
        out["post_activation"] = "relu"
    if m.has("norm"):
        eps = m.attr("norm", "epsilon")
        if eps is not None:
            out["epsilon"] = float(eps)
    return out


__all__ = ["SHARED_INPUT_VIEWS", "FusionPlanner", "op_view", "value_bytes"]
