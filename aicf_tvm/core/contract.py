"""EmitContract: what an Emit requires of its inputs and provides on its outputs.

A contract is a product lattice. Per tensor port it holds an effect, a shape/stride
fact, a numeric fact and an ABI fact (``PortFacts``); per pair of ports an alias fact.
Ports are named (``"x"``, ``"out"``, ``"out.1"``) and a missing entry means ⊤, so two
facts over different ports still combine component-wise. ``entails(F, R)`` checks
``F ⊑ R`` component by component and reports every failure with both values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .lattice import (
    ABIFact,
    Alias,
    Effect,
    Failure,
    NumericFact,
    ProductLattice,
    ShapeFact,
    explain_leq,
)
from .lattice.enums import READ, READWRITE, WRITE


@dataclass(frozen=True)
class PortFacts(ProductLattice):
    """All per-port components; each field defaults to ⊤."""

    effect: Effect = Effect.top()
    shape: ShapeFact = ShapeFact.top()
    numeric: NumericFact = NumericFact.top()
    abi: ABIFact = ABIFact.top()

    def __hash__(self) -> int:  # hashed once: facts key the analysis' transfer cache
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.effect, self.shape, self.numeric, self.abi))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:  # a hash holds for one process only
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


_TOP_PORT = PortFacts()


def _pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


@dataclass(frozen=True)
class ContractFacts:
    """Facts over named ports plus alias facts over unordered port pairs.

    Stored normalized (sorted, ⊤ entries dropped) so equal facts are equal values; the
    pairs are also held as mappings, built once, so a lookup does not rebuild one.
    """

    ports: tuple[tuple[str, PortFacts], ...] = ()
    alias: tuple[tuple[tuple[str, str], Alias], ...] = ()

    def __post_init__(self) -> None:
        ports = {k: v for k, v in dict(self.ports).items() if v != _TOP_PORT}
        alias = {_pair(*k): v for k, v in dict(self.alias).items() if not v.is_top()}
        object.__setattr__(self, "ports", tuple(sorted(ports.items())))
        object.__setattr__(self, "alias", tuple(sorted(alias.items())))
        object.__setattr__(self, "_ports", dict(self.ports))
        object.__setattr__(self, "_alias", dict(self.alias))
        object.__setattr__(self, "_hash", hash((self.ports, self.alias)))

    def __hash__(self) -> int:  # facts are hashed often (deduplicating call sites)
        return self._hash

    @classmethod
    def of(
        cls, ports: Mapping[str, PortFacts] | None = None,
        alias: Mapping[tuple[str, str], Alias] | None = None,
    ) -> ContractFacts:
        return cls(tuple((ports or {}).items()), tuple((alias or {}).items()))

    @classmethod
    def top(cls) -> ContractFacts:
        return cls()

    @property
    def port_map(self) -> Mapping[str, PortFacts]:
        """The port facts by port name (read-only; a missing port is ⊤)."""
        return MappingProxyType(self._ports)

    def port(self, name: str) -> PortFacts:
        return self._ports.get(name, _TOP_PORT)

    def alias_of(self, a: str, b: str) -> Alias:
        return self._alias.get(_pair(a, b), Alias.top())

    def port_names(self) -> list[str]:
        return [k for k, _ in self.ports]

    def with_port(self, name: str, facts: PortFacts) -> ContractFacts:
        return ContractFacts(tuple({**self._ports, name: facts}.items()), self.alias)

    def with_alias(self, a: str, b: str, fact: Alias) -> ContractFacts:
        return ContractFacts(self.ports, tuple({**self._alias, _pair(a, b): fact}.items()))

    def _combine(self, other: ContractFacts, op: str) -> ContractFacts:
        pnames = self._ports.keys() | other._ports.keys()
        anames = self._alias.keys() | other._alias.keys()
        ports = {n: getattr(self.port(n), op)(other.port(n)) for n in pnames}
        alias = {p: getattr(self.alias_of(*p), op)(other.alias_of(*p)) for p in anames}
        return ContractFacts(tuple(ports.items()), tuple(alias.items()))

    def join(self, other: ContractFacts) -> ContractFacts:
        return self._combine(other, "join")

    def meet(self, other: ContractFacts) -> ContractFacts:
        return self._combine(other, "meet")

    def leq(self, other: ContractFacts) -> bool:
        return not self.explain_leq(other, "")

    def explain_leq(self, other: ContractFacts, path: str) -> list[Failure]:
        out: list[Failure] = []
        for name, req in other.ports:
            out.extend(explain_leq(self.port(name), req, f"{path}{name}"))
        for (a, b), req in other.alias:
            out.extend(explain_leq(self.alias_of(a, b), req, f"{path}alias({a}, {b})"))
        return out

    def to_json(self) -> dict:
        return {
            "ports": {k: v.to_json() for k, v in self.ports},
            "alias": [[a, b, v.to_json()] for (a, b), v in self.alias],
        }

    @classmethod
    def from_json(cls, data: Mapping) -> ContractFacts:
        ports = {str(k): PortFacts.from_json(v) for k, v in dict(data.get("ports", {})).items()}
        alias = {(str(a), str(b)): Alias.from_json(v) for a, b, v in data.get("alias", [])}
        return cls.of(ports, alias)


@dataclass(frozen=True)
class Entailment:
    """Result of ``F ⊢ R``: truthy on success, else every failing component."""

    failures: tuple[Failure, ...] = ()
    by: str = ""

    def __bool__(self) -> bool:
        return not self.failures

    def explain(self) -> str:
        if not self.failures:
            return "entailed"
        suffix = f" required by {self.by}" if self.by else ""
        return "; ".join(f"{f}{suffix}" for f in self.failures)


def entails(facts: ContractFacts, requirement: ContractFacts, by: str = "") -> Entailment:
    """``facts ⊢ requirement``: ``facts ⊑ requirement`` in every component."""
    return Entailment(tuple(facts.explain_leq(requirement, "")), by)


@dataclass(frozen=True)
class EmitContract:
    """Requires (preconditions on inputs) and provides (guarantees), as a product lattice.

    Stronger contracts promise more and ask more: the order is component-wise on both.
    """

    requires: ContractFacts = field(default_factory=ContractFacts)
    provides: ContractFacts = field(default_factory=ContractFacts)

    @classmethod
    def top(cls) -> EmitContract:
        return cls()

    def leq(self, other: EmitContract) -> bool:
        return self.requires.leq(other.requires) and self.provides.leq(other.provides)

    def join(self, other: EmitContract) -> EmitContract:
        return EmitContract(self.requires.join(other.requires), self.provides.join(other.provides))

    def meet(self, other: EmitContract) -> EmitContract:
        return EmitContract(self.requires.meet(other.requires), self.provides.meet(other.provides))

    def to_json(self) -> dict:
        return {"requires": self.requires.to_json(), "provides": self.provides.to_json()}

    @classmethod
    def from_json(cls, data: Mapping) -> EmitContract:
        return cls(ContractFacts.from_json(data["requires"]), ContractFacts.from_json(data["provides"]))


def effects_contract(effects: Mapping[str, Effect], alias: Iterable[tuple[str, str, Alias]] = ()) -> EmitContract:
    """A contract that states only port effects (and optional alias facts)."""
    ports = {name: PortFacts(effect=e) for name, e in effects.items()}
    return EmitContract(provides=ContractFacts.of(ports, {(a, b): v for a, b, v in alias}))


# The seed's examples.
RELU_CONTRACT = effects_contract({"x": READ, "out": WRITE})
ADAM_STEP_CONTRACT = effects_contract(
    {"param": READWRITE, "m": READWRITE, "v": READWRITE, "grad": READ}
)
