"""Legality of S -> E* on the lattice facts (docs/design.md §4).

``judge`` checks, in order: no opaque member and no effectful Emit in S's span that
touches S's values (effects); ``F ⊢ Requires(E*)`` on the boundary facts; and
``Provides(E*) ⊑ Provides(S)`` on every output's numerics. Every failure is returned
with the component path and both lattice values.
"""

from __future__ import annotations

from tvm import relax

from aicf_tvm.core.contract import ContractFacts, PortFacts, entails
from aicf_tvm.core.emit_graph import EmitGraph
from aicf_tvm.core.facts import FactTable, alias_between
from aicf_tvm.core.lattice import AccumDtype, Effect, Failure, NumericFact, explain_leq


def effect_failures(graph: EmitGraph, members: list[int]) -> tuple[list[Failure], str]:
    """Effects of S's members must be pure (inputs ⊑ Read, outputs ⊑ Write), and no
    Emit that may write lies inside S's span touching S's values."""
    s = set(members)
    read, write = Effect("Read"), Effect("Write")
    for i in members:
        node = graph.nodes[i]
        if node.emit is None:  # a plain Relax view op (FuseEmits admits only those): pure
            continue
        provides = node.emit.contract.provides
        inputs = {p.name for p in node.emit.interface.inputs}
        for port in node.emit.interface.port_names():
            have, bound = provides.port(port).effect, read if port in inputs else write
            if not have.leq(bound):
                return [Failure(f"{node.var.name}.{port}.effect", have, bound)], ""
    touched = {graph.nodes[i].var for i in s}
    for i in s:
        touched.update(a for a in graph.nodes[i].value.args)
    for j in range(min(s), max(s)):
        other = graph.nodes[j]
        if j in s or other.emit is None:
            continue
        writes = [p for p in other.emit.interface.inputs
                  if other.emit.contract.provides.port(p.name).effect.writes]
        for port, arg in zip(other.emit.interface.inputs, other.value.args):
            if port in writes and arg in touched:
                have = other.emit.contract.provides.port(port.name).effect
                return [Failure(f"effect({other.var.name}.{port.name})", have, read)], \
                    f"{other.var.name} ({other.emit.kind}) between members may write {getattr(arg, 'name', arg)}"
    return [], ""


def numeric_of_outputs(table: FactTable, graph: EmitGraph, outputs: list[int]) -> list[NumericFact]:
    return [table.port_facts(graph.nodes[i].var).numeric for i in outputs]


def derived_numeric(have: NumericFact, accumulation: str | None) -> NumericFact:
    """What E* provides on an output S provided ``have`` on: the same, except a forced
    accumulator."""
    if accumulation is None:
        return have
    return NumericFact(have.math, AccumDtype.of(accumulation), have.determinism, have.rounding)


def numeric_failures(table: FactTable, graph: EmitGraph, outputs: list[int], accumulation: str | None) -> list[Failure]:
    fails: list[Failure] = []
    for i, have in zip(outputs, numeric_of_outputs(table, graph, outputs)):
        mine = derived_numeric(have, accumulation)
        fails.extend(explain_leq(mine, have, f"{graph.nodes[i].var.name}.numeric"))
    return fails


def boundary_facts(table: FactTable, ports: dict[str, relax.Expr]) -> ContractFacts:
    """F on the boundary: each tensor port's propagated facts, and the alias fact of each
    pair (a tuple port has no facts of its own: ⊤)."""
    tensors = {name: fact for name, expr in ports.items() if (fact := table.tensor(expr)) is not None}
    names = list(tensors)
    alias = {(a, b): alias_between(ports[a], ports[b], tensors[a], tensors[b])
             for i, a in enumerate(names) for b in names[i + 1:]}
    return ContractFacts.of({name: fact.facts for name, fact in tensors.items()}, alias)


def requires_failures(table: FactTable, ports: dict[str, relax.Expr], requires: ContractFacts,
                      label: str) -> list[Failure]:
    return list(entails(boundary_facts(table, ports), requires, by=label).failures)


__all__ = ["PortFacts", "boundary_facts", "derived_numeric", "effect_failures", "numeric_failures",
           "requires_failures"]
