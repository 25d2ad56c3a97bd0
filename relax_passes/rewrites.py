"""The rewrite passes that run around FuseEmits in the pipeline's fixpoint."""

from __future__ import annotations

from typing import Any


def rewrite_passes(report: Any, before: bool) -> list:
    """Passes before fusion (elimination) or after it (materialization), in order."""
    return []
