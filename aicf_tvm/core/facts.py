"""The facts the contract analysis gives each Relax value (docs/design.md §3).

A value is either one buffer, with a ``TensorFact``: its port facts (shape and strides,
numerics, ABI) and its *roots*, the buffers it may share storage with; or a tuple whose
items the analysis follows, with a ``TupleFact`` of one fact per field. Alias facts
follow from roots (``alias_between``). A value that is neither a tensor nor a followed
tuple (a shape, a PrimValue, a caller's tuple seen as a whole) is a ``TensorFact`` with
⊤ port facts: nothing is known of it as a tensor, and its roots still say which buffers
it may hold.

``FactTable`` is the analysis result (``aicf_tvm.core.propagation.analyze``): a fact per
value and the facts of every Emit call site. A pass asks ``tensor(expr)`` for the fact
of one buffer (``None`` for a tuple, whose items carry their own) or ``port_facts(expr)``
for its port facts (⊤ for a tuple).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

from tvm import relax

from .contract import ContractFacts, PortFacts
from .kinds.transfer import fresh_shape, value_facts
from .lattice import Alias, NumericFact

MUST, NO, MAY, UNKNOWN = (Alias(v) for v in ("MustAlias", "NoAlias", "MayAlias", "Unknown"))

# ("param", i, *item path) | ("const", id) | ("value", var): a buffer a value may hold
Root = tuple


@dataclass(frozen=True)
class TensorFact:
    """One value as a whole: its port facts and the buffers it may share."""

    facts: PortFacts
    roots: frozenset[Root]

    @property
    def from_caller(self) -> bool:
        return any(r[0] == "param" for r in self.roots)

    def tensors(self) -> tuple[TensorFact, ...]:
        return (self,)


@dataclass(frozen=True)
class TupleFact:
    """A tuple whose items the analysis follows: one fact per field."""

    fields: tuple[Fact, ...]

    def tensors(self) -> tuple[TensorFact, ...]:
        """Every buffer of the tuple, nested tuples flattened, in field order."""
        return tuple(t for f in self.fields for t in f.tensors())


Fact = Union[TensorFact, TupleFact]


def alias_between(a: Any, b: Any, fa: TensorFact, fb: TensorFact) -> Alias:
    """Alias of values ``a`` and ``b``: the same value MustAlias, shared roots MayAlias,
    two caller inputs Unknown, anything else (distinct fresh buffers) NoAlias."""
    if a.same_as(b):
        return MUST
    if fa.roots & fb.roots:
        return MAY
    if fa.from_caller and fb.from_caller:
        return UNKNOWN
    return NO


@dataclass
class FactTable:
    """The result of the analysis: a fact per value, per-site contract facts per Emit."""

    values: dict[relax.Var, Fact] = field(default_factory=dict)
    sites: dict[relax.GlobalVar, list[ContractFacts]] = field(default_factory=dict)

    def of(self, expr: Any) -> Fact:
        """The fact of a variable of the function, of a tuple written in place (its
        fields' facts: a nested tuple holds the buffers of its fields, not a new one), or
        of a constant."""
        if isinstance(expr, relax.Var):
            return self.values[expr]
        if isinstance(expr, relax.Tuple):
            return TupleFact(tuple(self.of(f) for f in expr.fields))
        return constant_fact(expr)

    def tensor(self, expr: Any) -> TensorFact | None:
        """The fact of ``expr`` as one buffer; None for a tuple (its items have their own)."""
        fact = self.of(expr)
        return fact if isinstance(fact, TensorFact) else None

    def port_facts(self, expr: Any) -> PortFacts:
        """The port facts of ``expr``; ⊤ for a tuple (no tensor fact holds of it as a whole)."""
        fact = self.tensor(expr)
        return fact.facts if fact is not None else PortFacts()


def constant_fact(expr: Any) -> TensorFact:
    """A constant is its own fresh, row-major, exactly known buffer."""
    ty = expr.ty
    roots = frozenset({("const", id(expr))})
    if isinstance(ty, relax.TensorType):
        return TensorFact(value_facts(fresh_shape(ty), NumericFact.exact(str(ty.dtype))), roots)
    return TensorFact(PortFacts(), roots)
