"""Legality of S -> E* on the lattice facts (DESIGN §4, step 3).

``judge`` checks, in order: no opaque member and no effectful Emit in S's span that
touches S's values (effects); ``F ⊢ Requires(E*)`` on the boundary facts; and
``Provides(E*) ⊑ Provides(S)`` on every output's numerics. Every failure is returned
with the component path and both lattice values.
"""

from __future__ import annotations

from typing import Any, Optional

from ..contract import ContractFacts, PortFacts, entails
from ..lattice import AccumDtype, Effect, Failure, NumericFact, explain_leq


def effect_failures(graph: Any, members: list[int]) -> tuple[list[Failure], str]:
    s = set(members)
    for i in members:
        node = graph.nodes[i]
        if node.is_opaque:
            return [Failure(f"effect({node.var.name})", Effect.top(), Effect("Write"))], \
                f"opaque member {node.var.name} ({node.emit.op}) may read and write every port"
    touched = {graph.nodes[i].var for i in s}
    for i in s:
        touched.update(a for a in graph.nodes[i].value.args)
    for j in range(min(s), max(s)):
        other = graph.nodes[j]
        if j in s or not other.is_opaque:
            continue
        for a in other.value.args:
            if a in touched:
                return [Failure(f"effect({getattr(a, 'name', a)})", Effect.top(), Effect("Read"))], \
                    f"opaque {other.var.name} ({other.emit.op}) between members may write it"
    return [], ""


def numeric_of_outputs(table: Any, graph: Any, outputs: list[int]) -> list[NumericFact]:
    out = []
    for i in outputs:
        fact = table.of(graph.nodes[i].var)
        out.append(fact.facts.numeric if not isinstance(fact, tuple) else NumericFact.top())
    return out


def derived_numeric(have: NumericFact, accumulation: Optional[str]) -> NumericFact:
    """What E* provides on an output S provided ``have`` on: the same, except a forced
    accumulator."""
    if accumulation is None:
        return have
    return NumericFact(have.math, AccumDtype.of(accumulation), have.determinism, have.rounding)


def numeric_failures(table: Any, graph: Any, outputs: list[int], accumulation: Optional[str]) -> list[Failure]:
    fails: list[Failure] = []
    for i, have in zip(outputs, numeric_of_outputs(table, graph, outputs)):
        mine = derived_numeric(have, accumulation)
        fails.extend(explain_leq(mine, have, f"{graph.nodes[i].var.name}.numeric"))
    return fails


def boundary_facts(table: Any, ports: dict[str, Any]) -> ContractFacts:
    facts = {}
    for name, expr in ports.items():
        fact = table.of(expr)
        if not isinstance(fact, tuple):
            facts[name] = fact.facts
    return ContractFacts.of(facts)


def requires_failures(table: Any, ports: dict[str, Any], requires: ContractFacts, label: str) -> list[Failure]:
    return list(entails(boundary_facts(table, ports), requires, by=label).failures)


__all__ = ["PortFacts", "boundary_facts", "derived_numeric", "effect_failures", "numeric_failures",
           "requires_failures"]
