"""The rewrite passes that run around FuseEmits in the pipeline's fixpoint."""

from __future__ import annotations

from typing import Any


def rewrite_passes(report: Any, before: bool) -> list:
    """Passes before fusion or after it, in order.

    Materialization runs before fusion so that an inserted Emit makes its candidate legal
    before a lower-priority candidate takes the same members; in the fixpoint the order
    is Eliminate -> Materialize -> Fuse, repeated.
    """
    from .eliminate_emits import EliminateEmits
    from .materialize_emits import MaterializeEmits

    return [EliminateEmits(report=report), MaterializeEmits(report=report)] if before else []
