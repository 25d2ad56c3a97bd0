"""The Emit library: fused Emit candidates with Requires / Build / Derive (DESIGN §4)."""

from __future__ import annotations


def library_kinds() -> list[str]:
    """Names of the fused kinds the library can build."""
    return []
