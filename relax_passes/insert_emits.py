"""InsertEmits: insert the Emits that make a refused candidate legal (docs/design.md §6),
the first job of MaterializeEmits.

A library candidate refused only because boundary inputs' shape/stride facts do not
entail its requirement gets, on each such input, the Emit that makes it true, when the
cost model says insert-and-fuse beats not fusing:

* ``broadcast_to`` where the input broadcasts to the required shape (a padding mask
  ``[1,1,1,S]`` for attention's ``[1,1,S,S]``, a residual into a norm);
* ``contiguous`` (an identity ``layout_transform``: a fresh row-major copy) where the
  shape is the required one but the strides are not (a transposed view fed to a
  candidate that requires a contiguous operand).

The inserted Emit writes and the fused kernel reads ``2 x bytes``, nothing when the
input is a constant (then the insert is folded at compile time); the fusion saves the
candidate's benefit. The next FuseEmits round then takes the candidate. The refused
matches are FuseEmits' own (``FusionPlanner.judged_matches``), so exactly its candidates
are repaired. Casts are never inserted: Relax ops take operands of one dtype, so no
candidate refusal is a dtype one, and a cast that widens an operand would change the
numerics the contract states.

Sound: ``broadcast_to`` to the shape the consumer broadcasts to anyway, and a copy of
the same values, leave every consumer's result unchanged.
"""

from __future__ import annotations

import tvm
from tvm import relax

from aicf_tvm.core.candidate import Candidate, Match, registered_candidates
from aicf_tvm.core.emit_graph import EmitGraph, Node
from aicf_tvm.core.facts import FactTable
from aicf_tvm.core.kinds.describe import type_shape
from aicf_tvm.core.lattice import ShapeFact
from aicf_tvm.core.report import Decision, FusionReport

from .emit_rewrite import EmitRewrite
from .fold_constant_emits import fold_and_tidy
from .fusion_planner import FusionPlanner, value_bytes
from .group_rewrite import body_at_call_site
from .lift_emits import build_emit_function


def _is_constant(expr: relax.Expr) -> bool:
    return isinstance(expr, tvm.ir.Constant)


def broadcasts_to(have: tuple | None, want: tuple | None) -> bool:
    """numpy's rule: ``have`` broadcasts to the static ``want`` of at least its rank."""
    if have is None or want is None or len(have) > len(want):
        return False
    if not all(isinstance(d, int) for d in want):
        return False
    return all(h == w or h == 1 for h, w in zip(reversed(have), reversed(want)))


def _fix_for(have: ShapeFact, want: ShapeFact) -> tuple[str, tuple] | None:
    """The Emit that turns a port's shape fact ``have`` into one entailing ``want``:
    ``("broadcast_to", dims)``, ``("contiguous", dims)`` or None when neither does."""
    if want.strides is None and broadcasts_to(have.dims, want.dims) and have.dims != want.dims:
        return "broadcast_to", tuple(want.dims)
    static = have.dims is not None and all(isinstance(d, int) for d in have.dims)
    if static and have.dims == want.dims and want.is_contiguous() and not have.is_contiguous():
        return "contiguous", tuple(have.dims)
    return None


def repairs(graph: EmitGraph, table: FactTable, candidates) -> list[tuple[Decision, Match, dict]]:
    """Refused library matches that inserted Emits on boundary inputs would make legal:
    (decision, match, {port: (fix kind, dims)}); every failure must be a shape/stride one
    on a boundary input that ``_fix_for`` repairs."""
    judged = FusionPlanner(graph, table, candidates, FusionReport()).judged_matches()
    out = []
    for decision, m in judged:
        if decision.accepted or decision.note or not decision.failures:
            continue
        # a legal candidate of at least this priority would take these members anyway
        if any(d.accepted and o.candidate.priority >= m.candidate.priority and set(o.members) & set(m.members)
               for d, o in judged):
            continue
        fixes: dict[str, tuple[str, tuple]] = {}
        for f in decision.failures:
            port = f.path[: -len(".shape")] if f.path.endswith(".shape") else None
            if port is None or port not in m.roles or port in m.role_nodes:
                break
            fix = _fix_for(f.have, f.required)
            if fix is None:
                break
            fixes[port] = fix
        else:
            out.append((decision, m, fixes))
    return out


def _inserted_call(kind: str, x: relax.Expr, dims: tuple) -> relax.Call:
    if kind == "broadcast_to":
        return relax.op.broadcast_to(x, dims)
    # a fresh row-major copy: an identity layout_transform (an injective Emit, never elided)
    identity = tvm.tirx.IndexMap.from_func(lambda *axes: list(axes), ndim=len(dims))
    return relax.op.layout_transform(x, index_map=identity)


class _Inserter:
    """The bindings of one block with the repairs worth it inserted before their users."""

    def __init__(self, bb: relax.BlockBuilder, graph: EmitGraph, report: FusionReport) -> None:
        self.bb, self.graph, self.report = bb, graph, report
        self.before: dict[int, list] = {}  # node index -> bindings to insert before it
        self.replace: dict[int, dict] = {}  # node index -> {old arg: new var}

    def repair(self, decision: Decision, m: Match, fixes: dict) -> None:
        """Insert the fixes when they cost less than the fusion saves: each inserted Emit
        writes and the fused kernel reads ``2 x bytes``, nothing for a constant (folded)."""
        cost = 0
        for port, (_, dims) in fixes.items():
            x = m.roles[port]
            cost += 0 if _is_constant(x) else 2 * value_bytes(relax.Var("t", relax.TensorType(dims, x.ty.dtype)))
        kinds = sorted({kind for kind, _ in fixes.values()})
        what = ", ".join(f"{p} {type_shape(m.roles[p].ty).show()} -> {ShapeFact.shape(d).show()}"
                         if kind == "broadcast_to" else f"{p} {_shown(m, p)} -> contiguous copy"
                         for p, (kind, d) in fixes.items())
        verdict = cost < decision.benefit
        note = (f"for {decision.candidate} [{', '.join(decision.members)}]: {what}; "
                f"cost {cost} B {'<' if verdict else '>='} benefit {decision.benefit} B")
        self.report.add(Decision(f"materialize:{'+'.join(kinds)}", decision.members, verdict, note=note))
        if not verdict:
            return
        for port, (kind, dims) in fixes.items():
            x = m.roles[port]
            users = [i for i in m.members if any(a.same_as(x) for a in self.graph.nodes[i].value.args)]
            if not users:
                continue
            call = self.bb.normalize(_inserted_call(kind, x, dims))
            built = build_emit_function(call)
            if built is None:
                continue
            gv = self.bb.add_func(built[0], f"emit_{kind}")
            name = getattr(x, "name", "const")
            new = relax.DataflowVar(f"{name}_{'bcast' if kind == 'broadcast_to' else 'contig'}", call.ty)
            self.before.setdefault(min(users), []).append(relax.VarBinding(new, self.bb.normalize(relax.Call(gv, [x]))))
            for i in users:
                self.replace.setdefault(i, {})[x] = new

    def bindings(self) -> list:
        out = []
        for node in self.graph.nodes:
            out.extend(self.before.get(node.index, []))
            b = self.graph.block.bindings[node.index]
            swap = self.replace.get(node.index)
            if swap:
                b = self._relifted(node, swap) or b
            out.append(b)
        return out

    def _relifted(self, node: Node, swap: dict) -> relax.VarBinding | None:
        """The member's op applied to the new argument, lifted to its own Emit function
        (the old function's parameter type no longer fits)."""
        if node.body is None:
            return None
        body = body_at_call_site(self.graph.mod, node)
        args = [next((v for k, v in swap.items() if k.same_as(a)), a) for a in body.args]
        call = self.bb.normalize(relax.Call(body.op, args, body.attrs, body.ty_args))
        built = build_emit_function(call)
        if built is None:
            return None
        gv = self.bb.add_func(built[0], node.callee.name_hint)
        return relax.VarBinding(node.var, self.bb.normalize(relax.Call(gv, list(built[1]))))


def _shown(m: Match, port: str) -> str:
    fact = m.shapes.get(port)
    return fact.show() if fact is not None else type_shape(m.roles[port].ty).show()


def insert_block(bb: relax.BlockBuilder, graph: EmitGraph, facts: FactTable, candidates,
                 report: FusionReport) -> list | None:
    """The block's bindings with the repairs worth it inserted (None: nothing inserted)."""
    inserter = _Inserter(bb, graph, report)
    for decision, m, fixes in repairs(graph, facts, candidates):
        inserter.repair(decision, m, fixes)
    return inserter.bindings() if inserter.before else None


@tvm.transform.module_pass(opt_level=0, name="InsertEmits")
class InsertEmits(EmitRewrite):
    """Insert the Emits that make refused candidates of ``main`` legal; report each repair."""

    def __init__(self, report: FusionReport | None = None, candidates: tuple[Candidate, ...] | None = None,
                 func_name: str = "main") -> None:
        super().__init__(report, func_name)
        if candidates is None:
            candidates = registered_candidates()
        self.candidates = tuple(sorted(candidates, key=lambda c: -c.priority))

    def rewrite_block(self, bb: relax.BlockBuilder, graph: EmitGraph,
                      facts: FactTable) -> relax.DataflowBlock | None:
        bindings = insert_block(bb, graph, facts, self.candidates, self.report)
        return None if bindings is None else relax.DataflowBlock(bindings)

    def finish(self, mod: tvm.IRModule) -> tvm.IRModule:
        return fold_and_tidy(mod)


__all__ = ["InsertEmits", "broadcasts_to", "insert_block", "repairs"]
