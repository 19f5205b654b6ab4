"""Pure: learn which nodes of a job deviate together from the start — its workload structure.

A job that does not label its pipeline stages can still have a heavier one; when stages are node-aligned
(as Megatron lays them out) the heavier stage's GPUs deviate together on every silent signal, exactly
like a slow node. What tells them apart is *when*: a stage is heavier from the job's first step, a node
goes bad at some moment. So for `learn_s` after a job can first be judged we count, per node, the
evaluations in which its GPUs deviated together; a node that did so in at least half of them is structure
for the rest of the job and only a throttle reason (evidence on the GPU itself) can flag it. The price,
documented in docs/detectors.md: a node already slow when the job starts is taken for structure unless
the job labels its groups (`group` in the push), which makes the comparison exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Structure:
    """What one job's first evaluations showed."""

    first: float  # unix s of the first evaluation that could judge the job
    evals: int  # evaluations counted while learning
    counts: Mapping[str, int] = field(default_factory=dict)  # node → evaluations it deviated as a block
    done: bool = False  # learning is over; `nodes` is final

    @property
    def nodes(self) -> frozenset[str]:
        """The structural nodes: deviating as a block in at least half the learning evaluations (so far)."""
        return frozenset(n for n, k in self.counts.items() if 2 * k >= self.evals)


def learn(known: Structure | None, blocks: frozenset[str], now: float, learn_s: float) -> Structure:
    """Fold one judged evaluation's blocks in (nothing changes once learning is over)."""
    if known is None:
        return Structure(now, 1, {n: 1 for n in blocks}, done=learn_s <= 0)
    if known.done:
        return known
    if now - known.first > learn_s:
        return Structure(known.first, known.evals, known.counts, done=True)
    counts = dict(known.counts)
    for n in blocks:
        counts[n] = counts.get(n, 0) + 1
    return Structure(known.first, known.evals + 1, counts)
