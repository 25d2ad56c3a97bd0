"""The rewrite passes that run around FuseEmits in the pipeline's fixpoint."""

from __future__ import annotations

from typing import Any


def rewrite_passes(report: Any, before: bool) -> list:
    """Passes before fusion (elimination) or after it (materialization), in order."""
    from .eliminate_emits import EliminateEmits
    from .materialize_emits import MaterializeEmits

    return [EliminateEmits(report=report)] if before else [MaterializeEmits(report=report)]
