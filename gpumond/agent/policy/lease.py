"""Pure: power-slack leases. The rules service offers a lower power limit for a GPU whose job waits on slower
peers; the agent holds it as a lease that runs out unless the next offer renews it.

The offers for a node are authoritative: a GPU no longer offered (its job ended, its steps stopped, the step
time rose and the service backed off) loses its lease at once; a service that cannot be reached renews
nothing, so every lease runs out `lease_s` after the last answer; a restarted agent starts with none. A lease
only ever *lowers* the limit the policy would otherwise want (thermal capping and the operator's persistent
limit win), and a guard bounds how many GPUs, and how many watts each, one renewal may lower.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class Offer:
    """One recommendation for one of this node's GPUs, as the rules service sent it."""

    uuid: str
    limit_w: float
    job: str
    # "Keep the lease you have": the service saw the GPU's limit change too recently to judge it again. Its
    # `limit_w` is what the service last saw, which may lag what this agent holds: it never moves a lease.
    hold: bool = False


@dataclass(frozen=True, slots=True)
class Lease:
    """A limit this agent may apply to a GPU until `until` (the agent's own clock)."""

    uuid: str
    limit_w: float
    job: str
    until: float


@dataclass(frozen=True, slots=True)
class Guard:
    """At most `max_gpus` GPUs lowered per renewal, each by at most `max_step_w` watts; a raise of more than
    `deadband_w` is taken at once, a smaller one waits (measurement noise is no reason to change a limit)."""

    max_gpus: int = 2
    max_step_w: float = 50.0
    deadband_w: float = 5.0


@dataclass(frozen=True, slots=True)
class Leases:
    """The leases this agent holds, by GPU uuid."""

    held: Mapping[str, Lease] = field(default_factory=lambda: MappingProxyType({}))

    def limit(self, uuid: str, now: float) -> Lease | None:
        """The GPU's lease if it has one that has not run out."""
        lease = self.held.get(uuid)
        return lease if lease is not None and now < lease.until else None


class OfferError(ValueError):
    """The rules service's answer cannot be read as offers; one line naming what."""


def parse_offers(body: object) -> list[Offer]:
    """The offers in a `GET /api/v1/power/offers` answer: {"offers": [{"gpu_uuid", "limit_w", "job", "basis"}, …]}
    (`basis` "hold": keep the lease as it is)."""
    items = body.get("offers") if isinstance(body, dict) else None
    if not isinstance(items, list):
        raise OfferError("the answer has no 'offers' list")
    out = []
    for i, o in enumerate(items):
        if not isinstance(o, dict):
            raise OfferError(f"offers[{i}]: not an object")
        uuid, limit, job = o.get("gpu_uuid"), o.get("limit_w"), o.get("job")
        if not isinstance(uuid, str) or not uuid:
            raise OfferError(f"offers[{i}].gpu_uuid: must be a GPU UUID")
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit <= 0:
            raise OfferError(f"offers[{i}].limit_w: must be a positive number of watts")
        out.append(Offer(uuid, float(limit), str(job or ""), o.get("basis") == "hold"))
    return out


def renew(leases: Leases, offers: Sequence[Offer], applied: Mapping[str, float], now: float, lease_s: float,
          guard: Guard) -> Leases:
    """The leases after one answer. `applied`: each GPU's limit now (what a lowering steps down from).

    A GPU not offered loses its lease; a `hold` offer renews the lease as it is (and makes none). An offer above
    the lease it has is taken at once (giving power back is never held). A lower one steps down from the GPU's
    limit by at most `max_step_w`, for at most `max_gpus` GPUs (the largest cuts first); the others keep their
    lease, renewed, and step down at a later answer. A step is taken from `applied`, never from a lease the
    policy has not taken up yet: answers that come faster than policy cycles still lower a GPU one step at a
    time."""
    until = now + lease_s
    held: dict[str, Lease] = {}
    lowering = []
    for o in offers:
        old = leases.held.get(o.uuid)
        base = applied.get(o.uuid)
        if base is None:
            continue  # not one of this node's GPUs, or its limit is unknown: nothing to step from
        current = min(base, old.limit_w) if old is not None else base
        if o.hold:
            if old is not None:
                held[o.uuid] = Lease(o.uuid, old.limit_w, o.job, until)
            continue
        if o.limit_w >= current:
            raise_ = o.limit_w - current > guard.deadband_w or old is None
            held[o.uuid] = Lease(o.uuid, o.limit_w if raise_ else current, o.job, until)
        else:
            lowering.append((current - o.limit_w, o, base, old))
    lowering.sort(key=lambda x: -x[0])
    for n, (_, o, base, old) in enumerate(lowering):
        if n < guard.max_gpus:
            step = max(o.limit_w, base - guard.max_step_w)
            held[o.uuid] = Lease(o.uuid, min(step, old.limit_w) if old is not None else step, o.job, until)
        elif old is not None:
            held[o.uuid] = Lease(o.uuid, old.limit_w, o.job, until)
    return Leases(MappingProxyType(held))


def expire(leases: Leases, now: float) -> Leases:
    """Without the leases that ran out (no answer renewed them in time)."""
    if all(now < lease.until for lease in leases.held.values()):
        return leases
    return Leases(MappingProxyType({u: l for u, l in leases.held.items() if now < l.until}))


def leased_limit(wanted: float, lease: Lease | None, floor_w: float) -> float | None:
    """The limit with the lease applied: lower than `wanted` (what the policy wants otherwise: persistent limit,
    thermal cap, or the original) and never below `floor_w`; None when the lease would not lower it."""
    if lease is None:
        return None
    leased = max(lease.limit_w, floor_w)
    return leased if leased < wanted else None
