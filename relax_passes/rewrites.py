"""The rewrite passes that run before FuseEmits in each round of the pipeline's fixpoint."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .eliminate_emits import EliminateEmits
from .materialize_emits import MaterializeEmits

if TYPE_CHECKING:
    import tvm

    from aicf_tvm.core.candidate import Candidate
    from aicf_tvm.core.report import FusionReport


def rewrite_passes(report: FusionReport, candidates: Sequence[Candidate] | None = None,
                   lanes: int | None = None) -> list[tvm.transform.Pass]:
    """The passes that run before fusion, in order.

    Materialization runs before fusion so that an inserted Emit makes its candidate legal
    before a lower-priority candidate takes the same members; in the fixpoint the order
    is Eliminate -> Materialize -> Fuse, repeated. ``candidates`` (default: the library's)
    are the ones FuseEmits uses, so Materialize repairs exactly those. ``lanes`` (the
    target's float32 vector width) lets Materialize choose blocked layouts for convolution
    chains; None keeps every layout as the model wrote it.
    """
    materialize = MaterializeEmits(report=report, lanes=lanes) if candidates is None else \
        MaterializeEmits(report, candidates, lanes=lanes)
    return [EliminateEmits(report=report), materialize]
