"""Pure: learn which nodes of a job deviate together from the start — its workload structure.

A job that does not label its pipeline stages can still have a heavier one; when stages are node-aligned
(as Megatron lays them out) the heavier stage's GPUs deviate together on every silent signal, exactly
like a slow node. What tells them apart is *when*: a stage is heavier from the job's first step, a node
goes bad at some moment. So for `learn_s` after a job can first be judged we count, per node, the
evaluations in which its GPUs deviated together; a node that did so in at least half of them, and in at
least half of those in the last third of the learning time, is structure for the rest of the job and only
a throttle reason (evidence on the GPU itself) can flag it. The last third is what tells a stage from a
transient: a node slowed for a while at the start (warm-up on a busy host, a noisy neighbour) deviates in
the first evaluations, and a 60 s median dominated by those seconds keeps it deviating for a while, but
by the end of learning it is back among its peers; a heavier stage still deviates then. The price,
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
    late_evals: int = 0  # evaluations counted in the last third of the learning time…
    late: Mapping[str, int] = field(default_factory=dict)  # …and node → how many of them it deviated in

    @property
    def nodes(self) -> frozenset[str]:
        """The structural nodes: deviating as a block in at least half the learning evaluations so far, and in
        at least half of those in the last third of the learning time (once there are any)."""
        late = self.late_evals
        return frozenset(n for n, k in self.counts.items()
                         if 2 * k >= self.evals and (late == 0 or 2 * self.late.get(n, 0) >= late))


def learn(known: Structure | None, blocks: frozenset[str], now: float, learn_s: float,
          current: frozenset[str] | None = None) -> Structure:
    """Fold one judged evaluation's blocks in (nothing changes once learning is over); in the last third of
    the learning time what counts is `current`, the blocks on what the GPUs do now (default: `blocks`)."""
    if known is None:
        return Structure(now, 1, {n: 1 for n in blocks}, done=learn_s <= 0)
    if known.done:
        return known
    if now - known.first > learn_s:
        return Structure(known.first, known.evals, known.counts, True, known.late_evals, known.late)
    counts = dict(known.counts)
    for n in blocks:
        counts[n] = counts.get(n, 0) + 1
    if 3 * (now - known.first) < 2 * learn_s:
        return Structure(known.first, known.evals + 1, counts)
    late = dict(known.late)
    for n in (blocks if current is None else current):
        late[n] = late.get(n, 0) + 1
    return Structure(known.first, known.evals + 1, counts, False, known.late_evals + 1, late)
