"""A detector's raw output for one evaluation, before persistence turns it into a Finding."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Candidate:
    """One entity flagged in one evaluation."""

    kind: str
    job: str
    node: str | None = None
    rank: int | None = None
    gpu_uuid: str | None = None
    score: float = 0.0
    evidence: Mapping[str, object] = field(default_factory=dict)
    # Flagged at once by two independent measurement chains (what the job pushes and what the GPU's
    # telemetry shows): noise does not do that, so persistence need not wait for a second evaluation.
    corroborated: bool = False
    # The detector's own test already required the evidence to last (sequential evidence, which has its own
    # minimum duration): persistence need not wait for more evaluations either.
    sustained: bool = False

    @property
    def key(self) -> tuple[str, str, str | None, int | None, str | None]:
        """Identity across evaluations."""
        return (self.kind, self.job, self.node, self.rank, self.gpu_uuid)
