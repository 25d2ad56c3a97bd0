"""Emit kinds: the per-op registry and the transfer rules of facts."""

from . import table  # noqa: F401  (fills the registry; registry.py never imports it)
from .registry import (
    CATEGORIES,
    OPAQUE_RULE,
    KindRule,
    kind_name,
    kinds_by_name,
    register,
    registered_ops,
    rule_for,
)

__all__ = [
    "CATEGORIES", "OPAQUE_RULE", "KindRule", "kind_name", "kinds_by_name", "register",
    "registered_ops", "rule_for",
]
