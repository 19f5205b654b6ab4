"""What fleet_scale's ranks send the rules shard, second by simulated second: the job SDK's pushes, directly or
through each node's relay.

- **The job's steps** (`JobSteps`): a synchronous job steps back to back, every rank ending each step together
  (they all wait for the slowest); a step is `step_s` long, or `slowdown` times as long while a silent straggler's
  episode is on (`Episode`: its compute slower, its GPU's telemetry unchanged). Then every other rank waits the
  extra in the step's collectives (its comm wait grows by it) and the straggler waits least.
- **A rank's SDK** (`RankSdk`): the SDK's own cadence (gpumond/job/pusher.py): a regular push every
  `push_interval_s` (5 s) at the rank's own phase, and an early push at once after a step that stands out against
  the rank's recent steps, at most one a second, the regular pushes keeping their phase: `gpumond.job.early`'s
  rule, history and `regular_after_early`, the functions the SDK itself calls. A push holds every step that ended
  since the last one, encoded as the SDK encodes it (`gpumond.job.payload.encode_columns`).
- **A node's relay** (`NodeRelay`): takes its ranks' pushes as they come and forwards what it holds every
  `relay.interval_s` (2 s) at its own phase, as one batch of those pushes (`gpumond.wire.batch`, what the agent's
  relay sends); and, as the agent's relay does (gpumond/agent/relay/early.py), an early push makes a round of its
  own ~50 ms later, at most one such round a second.

Pure but for the noise drawn from the generator each call is given; a load-generator process owns one `Senders`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpumond.job.early import DEFAULT as EARLY
from gpumond.job.early import StepHistory, push_early, regular_after_early

SDK_INTERVAL_S = 5.0  # the SDK's push_interval_s default
RELAY_INTERVAL_S = 2.0  # the agent's relay.interval_s default
RELAY_EARLY_AFTER_S, RELAY_EARLY_GAP_S = 0.05, 1.0  # the relay's early rounds (gpumond/agent/relay/early.py)
# A rank's data wait and comm wait (s) by its kind, outside an episode: a starved rank waits on its loader; the
# slowest rank waits least for its peers.
KINDS = {"base": (0.01, 0.1), "starved": (0.25, 0.0), "slow": (0.01, 0.002)}
SAMPLES = 32

Record = tuple[int, float, float, float, int, float]  # (step, end, duration, data wait, samples, comm wait)


@dataclass(frozen=True, slots=True)
class Episode:
    """A silent straggler: `rank` of the big job computes `slowdown` × as long from `onset` for `duration` s."""

    rank: int
    onset: float  # unix s (simulated)
    duration: float
    slowdown: float

    def active(self, t: float) -> bool:
        return self.onset <= t < self.onset + self.duration


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a job: its number, when it ended, how long it was, whose episode slowed it (None: nobody's)."""

    k: int
    end: float
    length: float
    straggler: int | None


class JobSteps:
    """A synchronous job's steps, back to back from `start`: `step_s` each, or an episode's slowdown × while one is
    on when the step begins."""

    def __init__(self, start: float, step_s: float, episodes: Sequence[Episode] = ()) -> None:
        self._begin, self._step_s, self._episodes, self._k = start, step_s, tuple(episodes), 0

    def until(self, t: float) -> list[Step]:
        """The steps that end by `t` and were not returned before, in order."""
        out = []
        while True:
            ep = next((e for e in self._episodes if e.active(self._begin)), None)
            length = self._step_s * (ep.slowdown if ep else 1.0)
            if self._begin + length > t:
                return out
            self._begin += length
            out.append(Step(self._k, self._begin, length, ep.rank if ep else None))
            self._k += 1


def records(rank: int, kind: str, steps: Sequence[Step], step_s: float, noise: Sequence[Sequence[float]]
            ) -> list[Record]:
    """A rank's records of `steps`; `noise[i]` = (duration, wait, comm) factors of step i (measured steps vary a
    little: detectors sort and rank them, and identical values would make that look cheaper than it is)."""
    base_wait, base_comm = KINDS[kind]
    out = []
    for s, (dur, wait, comm) in zip(steps, noise, strict=True):
        if s.straggler == rank:  # it computes longest: it waits least for its peers
            comm_s = KINDS["slow"][1] * comm
        else:  # everyone else waits the episode's extra in the step's collectives
            comm_s = base_comm * comm + (s.length - step_s)
        out.append((s.k, s.end, s.length * dur, base_wait * wait, SAMPLES, comm_s))
    return out


class RankSdk:
    """One rank's job SDK: a regular push every SDK_INTERVAL_S at its phase, an early push after a step that
    stands out (gpumond.job.early, the SDK's rule), each holding the steps that ended since the last push."""

    __slots__ = ("head", "_due", "_history", "_above", "_early_next", "_held", "early")

    def __init__(self, head: str, first_due: float) -> None:
        self.head = head
        self._due = first_due
        self._history = StepHistory(EARLY)
        self._above = math.inf
        self._early_next = -math.inf
        self._held: list[Record] = []
        self.early = 0  # early pushes so far

    def advance(self, recs: Iterable[Record], until: float) -> list[tuple[float, list[Record], bool]]:
        """Take the steps that ended up to `until` (in order); the pushes made meanwhile: (when, its steps, early)."""
        out: list[tuple[float, list[Record], bool]] = []
        for rec in recs:
            end = rec[1]
            while self._due <= end:
                self._push(out, self._due)
                self._due += SDK_INTERVAL_S
            self._held.append(rec)
            # The training thread's test on each step (reporter.py), against the threshold the last push derived.
            if push_early(rec[2], self._above, end, self._early_next):
                self._early_next = end + EARLY.min_gap_s
                self._push(out, end, early=True)
                self.early += 1
                self._due = regular_after_early(self._due, end, SDK_INTERVAL_S, EARLY)
        while self._due <= until:
            self._push(out, self._due)
            self._due += SDK_INTERVAL_S
        return out

    def _push(self, out: list, at: float, early: bool = False) -> None:
        if not self._held:  # the SDK would send a heartbeat; none is due while a rank steps twice a second
            return
        for rec in self._held:  # the push thread's history of what it pushed, and the threshold it derives
            self._history.add(rec[1], rec[2])
        self._above = self._history.above()
        out.append((at, self._held, early))
        self._held = []


class NodeRelay:
    """A node's relay: holds its ranks' push bodies, forwards them every `interval_s` (RELAY_INTERVAL_S, the agent's default) at its phase, as one batch,
    and RELAY_EARLY_AFTER_S after an early push (at most one such round every RELAY_EARLY_GAP_S)."""

    __slots__ = ("job", "_due", "_held", "_early_next", "_interval_s")

    def __init__(self, job: str, first_due: float, interval_s: float = RELAY_INTERVAL_S) -> None:
        self.job, self._due, self._interval_s = job, first_due, interval_s
        self._held: list[tuple[float, bytes, int, bool]] = []
        self._early_next = -math.inf  # when the next early round may be

    def advance(self, pushes: Iterable[tuple[float, bytes, int] | tuple[float, bytes, int, bool]],
                until: float) -> list[tuple[bytes, int]]:
        """Take the ranks' pushes (when, body, its steps[, early]) up to `until`; the batches forwarded meanwhile
        (encoded, with the steps they carry)."""
        from gpumond.wire.batch import encode_columns_batch

        self._held += sorted(((*p, False)[:4] for p in pushes), key=lambda p: p[0])
        out = []
        while True:
            early = [max(p[0] + RELAY_EARLY_AFTER_S, self._early_next) for p in self._held if p[3]]
            at = min(early, default=math.inf)
            if at < self._due and at <= until:
                self._early_next = at + RELAY_EARLY_GAP_S
            elif self._due <= until:
                at = self._due
                self._due += self._interval_s
            else:
                return out
            now = [p for p in self._held if p[0] <= at]
            if now:
                out.append((encode_columns_batch(self.job, [p[1] for p in now]), sum(p[2] for p in now)))
                self._held = self._held[len(now):]


def phase(key: int, interval_s: float) -> float:
    """A sender's phase within its interval, spread evenly and the same in every run."""
    return (key * 2654435761 % 10_007) / 10_007 * interval_s


@dataclass(frozen=True, slots=True)
class Rank:
    """A rank as its SDK knows it: job, rank, world size, node, GPU, and its kind (KINDS)."""

    job: str
    rank: int
    world: int
    node: str
    uuid: str
    kind: str


class Senders:
    """A load-generator process's share of the fleet (whole nodes): each rank's SDK, and with `via` "relay" each
    node's relay. `tick(t, noise)` advances them all to simulated time `t`: the HTTP bodies the shard gets meanwhile
    (each with the steps it carries)."""

    def __init__(self, nodes: Sequence[Sequence[Rank]], via: str, start: float, step_s: float,
                 episodes: Sequence[Episode], relay_interval_s: float = RELAY_INTERVAL_S) -> None:
        from gpumond.job.payload import encode_head

        self.via, self.step_s = via, step_s
        self._nodes = [[(r, RankSdk(encode_head({"job": r.job, "rank": r.rank, "world_size": r.world,
                                                 "node": r.node, "gpu_uuid": r.uuid}, "columns"),
                                     start + phase(hash_key(r), SDK_INTERVAL_S))) for r in ranks]
                       for ranks in nodes]
        self._relays = [NodeRelay(ranks[0].job, start + phase(hash_key(ranks[0]) // 8 + 1, relay_interval_s),
                                  relay_interval_s) for ranks in nodes] if via == "relay" else []
        # Every job starts stepping at `start`; only the big job has episodes (a schedule a job, stateful).
        self._steps = {job: JobSteps(start, step_s, episodes if job == "big-job" else ())
                       for job in {r.job for ranks in nodes for r in ranks}}
        self.ranks = sum(len(ranks) for ranks in nodes)

    def early(self) -> int:
        """Early pushes the ranks' SDKs made so far."""
        return sum(sdk.early for ranks in self._nodes for _, sdk in ranks)

    def tick(self, t: float, rng) -> list[tuple[bytes, int]]:
        """Advance to `t`: the bodies sent to the shard meanwhile, in order of the senders, with their steps."""
        from gpumond.job.payload import encode_columns

        ended = {job: s.until(t) for job, s in self._steps.items()}
        most = max((len(v) for v in ended.values()), default=0)
        # ±3 % on the duration, ±20 % on the waits, from a generator seeded per tick and process.
        noise = (1.0 + rng.uniform(-1.0, 1.0, (self.ranks, most, 3)) * (0.03, 0.2, 0.2)).tolist()
        out: list[tuple[bytes, int]] = []
        i = 0
        for n, ranks in enumerate(self._nodes):
            node_pushes = []
            for r, sdk in ranks:
                steps = ended[r.job]
                recs = records(r.rank, r.kind, steps, self.step_s, noise[i][:len(steps)])
                i += 1
                for at, held, early in sdk.advance(recs, t):
                    body = encode_columns(sdk.head, held, 0.0, 0.0)
                    if self._relays:
                        node_pushes.append((at, body, len(held), early))
                    else:
                        out.append((body, len(held)))
            if self._relays:
                out += self._relays[n].advance(node_pushes, t)
        return out


def hash_key(r: Rank) -> int:
    """A rank's key for its phase: its node's index times 8 plus its rank on the node (the same every run)."""
    return int(r.node.rsplit("-", 1)[1]) * 8 + r.rank % 8
