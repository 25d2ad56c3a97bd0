"""The facts the contract analysis gives each Relax value (docs/design.md §3).

A value is either one buffer, with a ``TensorFact``: its port facts (shape and strides,
numerics, ABI) and its *roots* (``Root``), the buffers it may share storage with: a
caller's (``ParamRoot``), a constant's (``ConstRoot``) or the one a binding allocates
(``ValueRoot``); or a tuple whose
items the analysis follows, with a ``TupleFact`` of one fact per field. Alias facts
follow from roots (``alias_between``). A value that is neither a tensor nor a followed
tuple (a shape, a PrimValue, a caller's tuple seen as a whole) is a ``TensorFact`` with
⊤ port facts: nothing is known of it as a tensor, and its roots still say which buffers
it may hold.

``FactTable`` is the analysis result (``aicf_tvm.core.propagation.analysis_of``): a
read-only mapping from each value to its fact, and the facts of every Emit call site. A
pass asks ``tensor(expr)`` for the fact of one buffer (``None`` for a tuple, whose items
carry their own) or ``port_facts(expr)`` for its port facts (⊤ for a tuple). Keys are the
Relax objects themselves (a Var, a Constant), which hash and compare by reference: the
same object is the same key however Python wraps it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tvm import relax

from .contract import ContractFacts, PortFacts
from .kinds.transfer import fresh_shape, value_facts
from .lattice import Alias, NumericFact

MUST, NO, MAY, UNKNOWN = (Alias(v) for v in ("MustAlias", "NoAlias", "MayAlias", "Unknown"))


@dataclass(frozen=True)
class ParamRoot:
    """The caller's buffer behind parameter ``index``, or behind the item at ``path`` of a
    tuple parameter (``path`` one index per level)."""

    index: int
    path: tuple[int, ...] = ()

    def item(self, i: int) -> ParamRoot:
        return ParamRoot(self.index, self.path + (i,))


@dataclass(frozen=True)
class ConstRoot:
    """The buffer of a constant (the Relax Constant itself: one object, one buffer)."""

    const: relax.Expr


@dataclass(frozen=True)
class ValueRoot:
    """The buffer a binding of ``var`` allocates."""

    var: relax.Var


Root = ParamRoot | ConstRoot | ValueRoot  # a buffer a value may hold


@dataclass(frozen=True)
class TensorFact:
    """One value as a whole: its port facts and the buffers it may share."""

    facts: PortFacts
    roots: frozenset[Root]

    @property
    def from_caller(self) -> bool:
        return any(isinstance(r, ParamRoot) for r in self.roots)

    def tensors(self) -> tuple[TensorFact, ...]:
        return (self,)


@dataclass(frozen=True)
class TupleFact:
    """A tuple whose items the analysis follows: one fact per field."""

    fields: tuple[Fact, ...]

    def tensors(self) -> tuple[TensorFact, ...]:
        """Every buffer of the tuple, nested tuples flattened, in field order."""
        return tuple(t for f in self.fields for t in f.tensors())


Fact = TensorFact | TupleFact


def alias_between(a: relax.Expr, b: relax.Expr, fa: TensorFact, fb: TensorFact) -> Alias:
    """Alias of values ``a`` and ``b``: the same value MustAlias, shared roots MayAlias,
    two caller inputs Unknown, anything else (distinct fresh buffers) NoAlias."""
    if a.same_as(b):
        return MUST
    if fa.roots & fb.roots:
        return MAY
    if fa.from_caller and fb.from_caller:
        return UNKNOWN
    return NO


@dataclass(frozen=True)
class FactTable:
    """The result of the analysis, read-only (one table serves every pass that finds the
    function unchanged): a fact per value, per-site contract facts per Emit."""

    values: Mapping[relax.Var, Fact] = field(default_factory=lambda: MappingProxyType({}))
    sites: Mapping[relax.GlobalVar, tuple[ContractFacts, ...]] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def frozen(cls, values: dict, sites: dict) -> FactTable:
        """The table of what an analysis found, read-only."""
        return cls(MappingProxyType(values), MappingProxyType({gv: tuple(s) for gv, s in sites.items()}))

    def of(self, expr: relax.Expr) -> Fact:
        """The fact of a variable of the function, of a tuple written in place (its
        fields' facts: a nested tuple holds the buffers of its fields, not a new one), or
        of a constant."""
        if isinstance(expr, relax.Var):
            return self.values[expr]
        if isinstance(expr, relax.Tuple):
            return TupleFact(tuple(self.of(f) for f in expr.fields))
        return constant_fact(expr)

    def tensor(self, expr: relax.Expr) -> TensorFact | None:
        """The fact of ``expr`` as one buffer; None for a tuple (its items have their own)."""
        fact = self.of(expr)
        return fact if isinstance(fact, TensorFact) else None

    def port_facts(self, expr: relax.Expr) -> PortFacts:
        """The port facts of ``expr``; ⊤ for a tuple (no tensor fact holds of it as a whole)."""
        fact = self.tensor(expr)
        return fact.facts if fact is not None else PortFacts()


def constant_fact(expr: relax.Expr) -> TensorFact:
    """A constant is its own fresh, row-major, exactly known buffer."""
    ty = expr.ty
    roots = frozenset({ConstRoot(expr)})
    if isinstance(ty, relax.TensorType):
        return TensorFact(value_facts(fresh_shape(ty), NumericFact.exact(str(ty.dtype))), roots)
    return TensorFact(PortFacts(), roots)
