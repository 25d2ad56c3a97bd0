"""A library candidate E*: pattern, Requires, Build options and Derive (docs/design.md §4).

Patterns are ``relax.dpl`` patterns over the op-level view of the Emit DAG (each
single-op Emit call seen as the op call it wraps). A pattern's variants are tried in
order; roles name the matched ops (members of S) and the boundary inputs.

The library (``aicf_tvm.library``, the layer above) registers its candidates here
(``register_candidates``); the passes read them back with ``registered_candidates``, so
``relax_passes`` needs nothing above the core. ``import aicf_tvm`` loads the library.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tvm import relax
from tvm.relax import dpl

from aicf_tvm.core.contract import ContractFacts, PortFacts
from aicf_tvm.core.errors import KindRegistrationError
from aicf_tvm.core.lattice import ShapeFact

Variant = tuple[dpl.DFPattern, dict[str, dpl.DFPattern]]


@dataclass
class Match:
    """One match of a candidate: members (graph node indices) and roles."""

    candidate: Candidate
    root: int
    members: tuple[int, ...]
    roles: dict[str, relax.Expr]  # role -> matched expr (op call of a member, or a boundary value)
    role_nodes: dict[str, int] = field(default_factory=dict)  # role -> member node index
    shapes: dict[str, ShapeFact] = field(default_factory=dict)  # role -> propagated shape

    def attr(self, role: str, name: str, default: Any = None) -> Any:
        call = self.roles.get(role)
        attrs = getattr(call, "attrs", None)
        if attrs is None or not hasattr(attrs, name):
            return default
        return getattr(attrs, name)

    def has(self, role: str) -> bool:
        return role in self.roles


RequiresFn = Callable[[Match], ContractFacts]
CheckFn = Callable[[Match], str | None]


@dataclass(frozen=True)
class Candidate:
    """A fused Emit the library can build, with its legality conditions.

    ``requires`` states preconditions on boundary ports as lattice facts (checked as
    ``F ⊢ Requires(E*)``); ``check`` states structural preconditions the lattices do
    not express (e.g. softmax over the last axis). ``accumulation`` forces the
    accumulator of every matmul/conv member (``None``: keep each member's own).
    """

    kind: str
    variants: Callable[[], list[Variant]]
    requires: RequiresFn = lambda m: ContractFacts()
    check: CheckFn = lambda m: None
    accumulation: str | None = None
    label: str = ""
    priority: int = 0

    @property
    def name(self) -> str:
        return self.label or self.kind


def port_requirement(**shapes: ShapeFact) -> ContractFacts:
    return ContractFacts.of({k: PortFacts(shape=v) for k, v in shapes.items()})


def last_dim(fact: ShapeFact):
    return None if fact.dims is None or not fact.dims else fact.dims[-1]


def op(name: str) -> Callable[..., dpl.DFPattern]:
    return dpl.is_op(name)


def commutative(name: str, a: dpl.DFPattern, b: dpl.DFPattern) -> dpl.DFPattern:
    return op(name)(a, b) | op(name)(b, a)


_REGISTERED: dict[str, Candidate] = {}


def register_candidates(*candidates: Candidate) -> None:
    """Make ``candidates`` the ones FuseEmits and MaterializeEmits try by default (a
    candidate replaces an earlier one of the same name)."""
    for cand in candidates:
        _REGISTERED[cand.name] = cand


def registered_candidates() -> tuple[Candidate, ...]:
    """The candidates tried by default, in registration order: the library's once
    ``aicf_tvm.library`` is imported (``aicf_tvm.compile`` does)."""
    if not _REGISTERED:
        raise KindRegistrationError(
            "no fusion candidates are registered: import aicf_tvm.library (the Emit library), "
            "or pass candidates= to FuseEmits / MaterializeEmits")
    return tuple(_REGISTERED.values())
