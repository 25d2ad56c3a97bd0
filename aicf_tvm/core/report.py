"""The fusion report: every candidate considered, and why it was taken or refused."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .lattice import Failure


@dataclass(frozen=True)
class Decision:
    """One candidate: the subgraph it covered and the verdict with its reasons."""

    candidate: str  # the fused kind, e.g. fused_gemm_bias_act
    members: tuple[str, ...]  # names of the bound values of the subgraph, in order
    accepted: bool
    failures: tuple[Failure, ...] = ()
    note: str = ""  # a structural reason (not convex, overlaps, opaque member, ...)
    benefit: int = 0  # bytes of intermediate traffic removed

    def __str__(self) -> str:
        verdict = "fused  " if self.accepted else "refused"
        head = f"{verdict} {self.candidate} [{', '.join(self.members)}]"
        if self.accepted:
            return head + (f" saves {self.benefit} B" if self.benefit else "") + (f": {self.note}" if self.note else "")
        reasons = [f"{f} required by {self.candidate}" for f in self.failures]
        if self.note:
            reasons.append(self.note)
        return head + ": " + "; ".join(reasons)


APPROXIMATE = "approximate:"  # the candidate prefix of a decision that changes results by the user's choice


@dataclass
class FusionReport:
    """All decisions of a compilation, in the order they were made."""

    decisions: list[Decision] = field(default_factory=list)
    _seen: set = field(default_factory=set, repr=False)

    def add(self, decision: Decision) -> None:
        """Record a decision; the same verdict on the same subgraph is kept once."""
        if decision not in self._seen:
            self._seen.add(decision)
            self.decisions.append(decision)

    @property
    def accepted(self) -> list[Decision]:
        return [d for d in self.decisions if d.accepted]

    @property
    def refused(self) -> list[Decision]:
        return [d for d in self.decisions if not d.accepted]

    @property
    def approximations(self) -> list[Decision]:
        """What the user opted into that changes results (``approximate:*``: weights rounded
        to int8, ``aicf_tvm.driver.quantize_weights``; a QDQ model's convolutions in
        integers, ``relax_passes.integer_qdq``), one decision per value changed."""
        return [d for d in self.decisions if d.accepted and d.candidate.startswith(APPROXIMATE)]

    def summary(self) -> str:
        def counts(decisions: list[Decision]) -> str:
            return ", ".join(f"{k} x{n}" for k, n in sorted(Counter(d.candidate for d in decisions).items()))

        fused = [d for d in self.accepted if not d.candidate.startswith(APPROXIMATE)]
        line = f"fusion: {len(fused)} fused ({counts(fused) or 'none'}), {len(self.refused)} refused"
        if self.approximations:
            line += f"; approximations opted into: {counts(self.approximations)}"
        return line

    def __str__(self) -> str:
        return "\n".join([self.summary()] + [f"  {d}" for d in self.decisions])
