"""Registry of Emit kinds: one entry per Relax op, with a conservative default.

An entry gives the kind name, a category (what fusion may do with it), a math tag, an
attribute reader and a stride transfer rule for views. Adding an op means adding an
entry (``table.py``), never editing a pass. An op with no entry lifts to ``opaque``:
the weakest contract (ReadWrite on every port, ⊤ everywhere), never fused or moved.
An op or kind name registered twice is refused (``KindRegistrationError``, raised while
``table.py`` imports), so no entry silently replaces another.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import KindRegistrationError
from ..lattice import ShapeFact

# What fusion may do with an Emit of this category.
ELEMENTWISE = "elementwise"  # same shape in and out, pointwise
BROADCAST = "broadcast"  # pointwise with broadcasting inputs
INJECTIVE = "injective"  # every output element reads one computed input element
VIEW = "view"  # injective and expressible as strides over its input
REDUCTION = "reduction"
MATMUL = "matmul"
CONV = "conv"
POOL = "pool"
NORM = "norm"  # layer_norm, rms_norm, batch_norm, group_norm
SOFTMAX = "softmax"
CREATION = "creation"  # no tensor input (zeros, arange, full)
SCAN = "scan"  # sort, top-k, cumulative sums: the target's own kernel, never fused
# TOPI writes the kernel as te.extern / ir_builder code (scatter, median's argsort), not a
# te.compute: FuseTIR cannot merge it with its neighbours, so it is never fused
EXTERN = "extern"
OPAQUE = "opaque"

CATEGORIES = (
    ELEMENTWISE, BROADCAST, INJECTIVE, VIEW, REDUCTION, MATMUL, CONV, POOL, NORM, SOFTMAX,
    CREATION, SCAN, EXTERN, OPAQUE,
)

# transfer(call, input shape facts, output dims) -> output strides or None (unknown)
StrideRule = Callable[[Any, list[ShapeFact], tuple], tuple | None]


@dataclass(frozen=True)
class KindRule:
    """How one Relax op lifts to an Emit and how facts flow through it."""

    kind: str
    category: str
    math: str = "exact"
    strides: StrideRule | None = None  # views only
    has_effects: bool = False  # True only for opaque: ReadWrite on every port

    @property
    def is_opaque(self) -> bool:
        return self.category == OPAQUE


OPAQUE_RULE = KindRule("opaque", OPAQUE, math="approx", has_effects=True)

_REGISTRY: dict[str, KindRule] = {}


def register(op_name: str, category: str, kind: str | None = None, math: str = "exact",
             strides: StrideRule | None = None) -> KindRule:
    """Add the entry of ``op_name``; an op or kind name already registered is refused."""
    if category not in CATEGORIES:
        raise KindRegistrationError(f"unknown category {category!r} for {op_name}")
    if op_name in _REGISTRY:
        raise KindRegistrationError(
            f"{op_name} is registered twice (as {_REGISTRY[op_name].category}, then as "
            f"{category}); keep one entry in aicf_tvm/core/kinds/table.py")
    rule = KindRule(kind or kind_name(op_name), category, math, strides)
    owners = [op for op, r in _REGISTRY.items() if r.kind == rule.kind]
    if owners or rule.kind == OPAQUE_RULE.kind:
        owner = owners[0] if owners else "ops with no entry"
        raise KindRegistrationError(
            f"kind {rule.kind!r} of {op_name} is already the kind of {owner}; "
            "give register(..., kind=) a distinct name")
    _REGISTRY[op_name] = rule
    return rule


def kind_name(op_name: str) -> str:
    """``relax.nn.conv2d`` -> ``conv2d``."""
    name = op_name.removeprefix("relax.")
    for prefix in ("nn.", "image.", "ccl."):
        name = name.removeprefix(prefix)
    return name.replace(".", "_")


def rule_for(op_name: str) -> KindRule:
    """The registered rule, or the opaque rule for an op we do not know."""
    return _REGISTRY.get(op_name, OPAQUE_RULE)


def registered_ops() -> dict[str, KindRule]:
    return dict(_REGISTRY)


def kinds_by_name() -> dict[str, KindRule]:
    return {r.kind: r for r in registered_ops().values()} | {"opaque": OPAQUE_RULE}
