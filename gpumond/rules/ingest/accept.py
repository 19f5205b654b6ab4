"""The push endpoint's decisions, apart from the HTTP server: who may push, how often, what, and how much."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from gpumond.config.rules import RulesConfig
from gpumond.rules.ingest.auth import TokenAuth
from gpumond.web.body import declared_too_large
from gpumond.push.batch import MAX_REMEMBERED_HEADS, ColumnsBatchError, HeadJudge, parse_columns_batch
from gpumond.push.body import PushBody, head_model
from gpumond.push.values import StepColumns
from gpumond.push.body import PayloadError, columns_model, parse, push_model
from gpumond.rules.ingest.ratelimit import RateLimiter, retry_after
from gpumond.rules.ingest.stats import IngestStats
from gpumond.rules.store import CapExceeded, RankStore
from gpumond.wire.batch import BatchError, split_batch
from gpumond.wire.media import BATCH_COLUMNS_TYPE, BATCH_TYPE, COLUMNS_TYPE, JSON_TYPE
from gpumond.wire.routing import shard_of

log = logging.getLogger("gpumond.rules.ingest")

_WARN_EVERY_S = 60.0  # one log line per kind of refusal per minute; the counters have the totals
# A cap refusal is 429, not 503: the service is up and other series are accepted; room comes back as held
# entries expire or windows roll, so the client should back off and retry (the SDK does on 429), and a load
# balancer must not take a 503 as "this replica is down". The body's "cap" says which cap refused.
CAP_STATUS = 429
CAP_RETRY_AFTER_S = 30
# A push for a job of another shard is 421 Misdirected Request (RFC 9110 §15.5.20: this server is not the one
# to answer for that request, and a client may retry it elsewhere): the body is valid, so not 400/422; the
# replica is healthy, so not 503 (a load balancer would take it out and the SDK would retry forever); and no
# 3xx, because a replica does not know the other shards' addresses and a redirected POST is not followed by
# the SDK. Sending the same push here again cannot succeed, so the SDK drops it; the fix is its routing.
MISROUTED_STATUS = 421


@dataclass(frozen=True, slots=True)
class Reply:
    """What to answer: status, JSON body, extra headers."""

    status: int
    body: dict[str, object]
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Client:
    """An admitted caller: the token that matched (never the token itself) and where it came from."""

    identity: str
    address: str
    columns: bool = False  # the body is in the columnar encoding (its Content-Type said so)
    batch: bool = False  # the body is a batch of columnar pushes of one job, a line each (the node relay's before)
    batch_columns: bool = False  # the body is a columnar batch of one job's pushes (the node relay's)


class Ingest:
    """Authenticates, rate-limits, bounds, validates and stores pushes; every outcome is counted."""

    def __init__(self, *, config: RulesConfig, store: RankStore, clock: Callable[[], float],
                 stats: IngestStats | None = None) -> None:
        limits = config.limits
        self.ranks = store
        self.stats = stats or IngestStats(store)
        self.max_body_bytes = limits.max_body_bytes
        self.model = push_model(limits.max_string_len, limits.max_steps_per_push)
        self.columns_model = columns_model(limits.max_string_len, limits.max_steps_per_push)
        self._heads = HeadJudge(head_model(limits.max_string_len), min(limits.max_ranks, MAX_REMEMBERED_HEADS))
        self._max_steps = limits.max_steps_per_push
        self._auth = TokenAuth(config.tokens, config.allow_unauthenticated)
        self._limiter = RateLimiter(limits.pushes_per_second_per_client, limits.burst, limits.max_clients, clock)
        self._rate_text = f"{limits.pushes_per_second_per_client:g} pushes/s (burst {limits.burst})"
        self._skew_s = limits.max_clock_skew_s
        self._shard = config.shard
        self._clock = clock
        self._warned: dict[str, float] = {}

    def admit(self, *, authorization: str | None, address: str, content_type: str | None,
              content_encoding: str | None, content_length: str | None) -> Client | Reply:
        """Everything decided before reading a byte of the body: a Client, or the refusal."""
        auth = self._auth.check(authorization)
        if auth.identity is None:
            challenge = 'Bearer realm="gpumond"' + ("" if auth.missing else ', error="invalid_token"')
            self._warn("auth", f"push refused: {auth.problem}", address=address)
            return self._reply(401, auth.problem, ("WWW-Authenticate", challenge))
        wait = self._limiter.take((auth.identity, address))
        self.stats.rate_limit_clients = len(self._limiter)
        if wait:
            after = retry_after(wait)
            self._warn("rate", "push refused: rate limit", address=address, client=auth.identity)
            return self._reply(429, f"rate limit: more than {self._rate_text} from this client; "
                                    f"retry after {after} s", ("Retry-After", after))
        media = JSON_TYPE if content_type is None else content_type.split(";")[0].strip().lower()
        if media not in (JSON_TYPE, COLUMNS_TYPE, BATCH_COLUMNS_TYPE, BATCH_TYPE):
            return self._reply(415, f"Content-Type must be {JSON_TYPE} (steps as objects), {COLUMNS_TYPE} "
                                    f"(steps as columns) or {BATCH_COLUMNS_TYPE} (a relay's batch) "
                                    f"(got {content_type[:64]!r})")
        if content_encoding is not None and content_encoding.strip().lower() not in ("", "identity"):
            return self._reply(415, f"Content-Encoding {content_encoding[:32]!r} is not supported; send the JSON "
                                    "uncompressed")
        if declared_too_large(content_length, self.max_body_bytes):
            return self.too_large()
        return Client(auth.identity, address, media == COLUMNS_TYPE, media == BATCH_TYPE, media == BATCH_COLUMNS_TYPE)

    def too_large(self) -> Reply:
        """The answer to a body over limits.max_body_bytes."""
        return self._reply(413, f"body larger than limits.max_body_bytes ({self.max_body_bytes} bytes)")

    def accept(self, client: Client, body: bytes) -> Reply:
        """Validate and store one push body (or, from a relay, a batch of them) from an admitted client."""
        if client.batch_columns:
            return self._accept_columns_batch(client, body)
        if client.batch:
            return self._accept_batch(client, body)
        return self._judge(self.columns_model if client.columns else self.model, body, client)

    def _accept_columns_batch(self, client: Client, body: bytes) -> Reply:
        """A columnar batch: its framing and every step value judged once for the whole batch, each push's head
        alone; then each push stored as if it had come alone, and one answer listing each one's outcome in order."""
        try:
            job, pushes, ends = parse_columns_batch(body, self._heads, self._max_steps)
        except ColumnsBatchError as err:
            return self._reply(err.status, f"batch: {err}")
        if self._shard is not None and (owner := shard_of(job, self._shard.count)) != self._shard.index:
            return self._misrouted(job, owner, client)
        now = self._clock()
        on_time = not len(ends) or ends.max() <= now + self._skew_s  # else each push is looked at alone
        results = []
        for push in pushes:
            if isinstance(push, PayloadError):
                results.append(_result(self._reply(push.status, push.message)))
            else:
                results.append(_result(self._keep(*push, client, now=now, on_time=on_time)))
        return Reply(202, {"results": results})

    def _accept_batch(self, client: Client, body: bytes) -> Reply:
        """Each push of a batch judged as if it had come alone; one answer listing each one's outcome in order.
        The batch itself is refused whole only for what concerns it whole: its framing or its job's shard."""
        try:
            job, pushes = split_batch(body)
        except BatchError as err:
            return self._reply(400, f"batch: {err}")
        if self._shard is not None and (owner := shard_of(job, self._shard.count)) != self._shard.index:
            return self._misrouted(job, owner, client)
        results = [_result(self._judge(self.columns_model, line, client, job=job)) for line in pushes]
        return Reply(202, {"results": results})

    def _judge(self, model: type, body: bytes, client: Client, *, job: str | None = None) -> Reply:
        """Validate and store one push; `job`: the batch's, which the push must name."""
        try:
            push = parse(model, body)
        except PayloadError as err:
            return self._reply(err.status, err.message)
        if job is not None and push.job != job:
            return self._reply(422, f"job: must be the batch's job {job!r} (got {push.job!r})")
        if (job is None and self._shard is not None
                and (owner := shard_of(push.job, self._shard.count)) != self._shard.index):
            return self._misrouted(push.job, owner, client)
        return self._keep(push, push.step_columns(), client)

    def _keep(self, push: PushBody, steps: StepColumns, client: Client, *, now: float | None = None,
              on_time: bool = False) -> Reply:
        """Store one judged push (its steps' ends within the clock skew); the answer it gets. `on_time`: the caller
        found every step's end within the skew already (a batch's, all at once), at `now`."""
        now = self._clock() if now is None else now
        if not on_time and len(steps) and steps.end.max() > now + self._skew_s:  # one reduction for a push
            i = int((steps.end > now + self._skew_s).argmax())
            return self._reply(422, f"steps[{i}].end: {steps.end[i] - now:.0f} s in the future, more than "
                                    f"limits.max_clock_skew_s ({self._skew_s:g}); check the clock of node "
                                    f"{push.node!r}")
        info = push.rank_info()
        try:
            stored = self.ranks.record(info, steps, now, push.incarnation, final=push.final)
        except CapExceeded as err:
            self._warn(f"cap:{err.cap}", "push refused: cap reached", cap=err.cap, job=info.job, client=client.identity)
            self.stats.count(CAP_STATUS)
            return Reply(CAP_STATUS, {"error": str(err), "cap": err.cap},
                         (("Retry-After", str(CAP_RETRY_AFTER_S)),))
        self.stats.count(202)
        if stored.restarted:
            log.info("rank restarted: its previous process's steps let go", extra={
                "job": info.job, "rank": info.rank, "node": info.node, "incarnation": push.incarnation})
        dropped = stored.dropped() if stored.accepted != len(steps) else None  # every step is kept or dropped
        if dropped:
            # Every step not stored is named with its reason, so the SDK counts it dropped, not pushed.
            self._warn("dropped", "push partly kept", job=info.job, rank=info.rank, client=client.identity,
                       **dropped)
            return Reply(202, {"accepted": stored.accepted, "dropped": dropped})
        return Reply(202, {"accepted": stored.accepted})

    def _misrouted(self, job: str, owner: int, client: Client) -> Reply:
        """Refuse, before storing anything, a push whose job another shard evaluates (it would never be)."""
        n = self._shard.count if self._shard is not None else 1
        self._warn("shard", "push refused: job belongs to another shard", job=job, shard=f"{owner}/{n}",
                   this_shard=str(self._shard), client=client.identity)
        self.stats.misrouted(owner)
        message = (f"job {job!r} belongs to shard {owner} of {n} (crc32(job) mod {n}), not this replica "
                   f"({self._shard}): push to shard {owner}; the job SDK routes by itself with "
                   f"GPUMOND_SHARDS={n} and {{shard}} in GPUMOND_ENDPOINT")
        return self._reply(MISROUTED_STATUS, message, extra={"shard": owner, "shards": n})

    def _reply(self, status: int, message: str, *headers: tuple[str, str],
               extra: dict[str, object] | None = None) -> Reply:
        self.stats.count(status)
        return Reply(status, {"error": message, **(extra or {})}, headers)

    def _warn(self, key: str, message: str, **fields: object) -> None:
        now = self._clock()
        if now - self._warned.get(key, float("-inf")) >= _WARN_EVERY_S:
            self._warned[key] = now
            log.warning(message, extra={**fields, "repeats": "counted in gpumond_rules_push_requests_total"})


def _result(reply: Reply) -> dict[str, object]:
    """A push's outcome in a batch's answer: its answer's body, with the status it would have had alone when that
    is not 202, and its Retry-After (a cap's) as a number."""
    if reply.status == 202:
        return reply.body
    entry: dict[str, object] = {"status": reply.status, **reply.body}
    for name, value in reply.headers:
        if name == "Retry-After":
            entry["retry_after_s"] = int(value)
    return entry
