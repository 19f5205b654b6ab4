"""Two real `gpumond rules` shards (0/2 and 1/2) on 127.0.0.1 and job SDK reporters routing by `{shard}`.

Only 127.0.0.1 may be used, so the two shards differ by port: they listen on <B>0 and <B>1 and the
reporters push to `http://127.0.0.1:<B>{shard}` (the SDK substitutes `{shard}` textually, anywhere in
the URL). Every job's findings must come from its own shard and from no other; a push sent by hand to
the wrong shard is refused with 421 and counted; a reporter pointed at the wrong shard drops and counts.
"""

from __future__ import annotations

import json
import random
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpumond.job import Reporter
from gpumond.wire.routing import shard_of
from tests.integration.alert_helpers import TOKEN, RulesProcess
from tests.integration.helpers import LOOPBACK, parse_metrics, value, wait_until
from tests.fakes import FakeClock

pytestmark = pytest.mark.integration

SHARDS = 2
# Six jobs, three per shard (checked below, so a change to the hash cannot quietly empty a shard).
JOBS = ("train-a", "train-b", "train-c", "train-d", "train-e", "train-f")
RANKS = 2
STEPS = 8


def _port_pair() -> int:
    """B such that ports B*10 and B*10+1 on 127.0.0.1 were both free a moment ago."""
    rng = random.Random()
    for _ in range(200):  # bounded: on a busy machine most pairs are free anyway
        base = rng.randrange(2000, 6000)  # ports 20000-59991: above the usual services, below most ephemerals
        socks = []
        try:
            for shard in range(SHARDS):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind((LOOPBACK, base * 10 + shard))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free pair of ports <B>0, <B>1 on 127.0.0.1 after 200 tries")


@pytest.fixture
def shards(tmp_path: Path) -> Iterator[tuple[int, list[RulesProcess]]]:
    """Both replicas started; (B, [shard 0, shard 1])."""
    base = _port_pair()
    procs = [RulesProcess(tmp_path / f"shard-{i}", {}, state_dir=tmp_path / f"state-{i}", port=base * 10 + i,
                          evaluation_interval_s=0.5, shard=f"{i}/{SHARDS}") for i in range(SHARDS)]
    try:
        for p in procs:
            p.start()
        yield base, procs
    finally:
        for p in procs:
            if p.proc is not None:
                p.stop()


def _report(job: str, rank: int, endpoint: str, shards: int | None) -> Reporter:
    """One rank that ran STEPS steps of 1 s, each waiting 0.5 s on its loader, pushed and still running: a
    reporter's close() ends its job (the final push), which releases the job and its findings. Close it."""
    clock = FakeClock()
    rep = Reporter(endpoint=endpoint, token=TOKEN, job=job, rank=rank, world_size=RANKS, node=f"{job}-node",
                   gpu_uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{job}/{rank}')}", shards=shards,
                   push_interval_s=0.2, timeout_s=5.0, clock=clock, wall=time.time, handle_sigterm=False)
    assert rep.enabled, rep.stats.last_error

    def loader() -> Iterator[int]:
        for i in range(STEPS):
            clock.now += 0.5  # waiting on data
            yield i

    for _ in rep.wrap(loader()):
        clock.now += 0.5  # computing
    # The steps go in one push at the next wake (the loop takes microseconds); the frozen clock sends no
    # heartbeat after it, so each rank makes exactly one request until it closes.
    wait_until(lambda: rep.stats.pushed_steps + rep.stats.dropped_steps == STEPS, timeout=20,
               what=f"{job} rank {rank} to push its steps")
    return rep


def _findings(proc: RulesProcess) -> list[dict[str, Any]]:
    return json.loads(httpx.get(f"{proc.url}/api/v1/findings", timeout=5.0).content)["findings"]


def test_each_job_is_evaluated_by_its_own_shard_and_a_misrouted_push_is_refused(
        shards: tuple[int, list[RulesProcess]]) -> None:
    base, procs = shards
    owner = {job: shard_of(job, SHARDS) for job in JOBS}
    assert sorted(owner.values()) == [0, 0, 0, 1, 1, 1], owner
    template = f"http://{LOOPBACK}:{base}{{shard}}"
    reporters = [_report(job, rank, template, SHARDS) for job in JOBS for rank in range(RANKS)]
    try:
        _judged_by_their_own_shards(procs, owner, reporters)
    finally:
        for rep in reporters:
            rep.close(timeout_s=5)


def _judged_by_their_own_shards(procs: list[RulesProcess], owner: dict[str, int], reporters: list[Reporter]
                                ) -> None:
    for rep in reporters:
        stats = rep.stats
        assert (stats.pushed_steps, stats.dropped_steps, stats.failed_pushes) == (STEPS, 0, 0), stats

    def starved_jobs(shard: int) -> set[str] | None:
        found = {f["job"] for f in _findings(procs[shard]) if f["kind"] == "io_starved_job"}
        return found if found == {j for j in JOBS if owner[j] == shard} else None

    for shard in range(SHARDS):
        wait_until(lambda s=shard: starved_jobs(s), timeout=20,
                   what=f"shard {shard}/{SHARDS} to find exactly its own jobs io-starved",
                   describe=procs[shard].describe)
    for shard, proc in enumerate(procs):  # nothing of the other shard's was stored here either
        families = parse_metrics(httpx.get(f"{proc.url}/metrics", timeout=5.0).text)
        assert value(families, "gpumond_rules_held", kind="jobs") == 3
        assert value(families, "gpumond_rules_push_requests_total", code="202") == 3 * RANKS

    # A raw push for a shard-1 job sent to shard 0: refused before anything is stored, and counted.
    job = next(j for j in JOBS if owner[j] == 1)
    body = {"job": job, "rank": 0, "world_size": RANKS, "node": "n", "gpu_uuid": f"GPU-{uuid.uuid4()}",
            "steps": [{"step": 100, "end": time.time() - 1, "duration_s": 1.0, "data_wait_s": 0.1}]}
    r = httpx.post(f"{procs[0].url}/api/v1/push", json=body, headers={"Authorization": f"Bearer {TOKEN}"},
                   timeout=5.0)
    assert r.status_code == 421, r.text
    reply = r.json()
    assert (reply["shard"], reply["shards"]) == (1, SHARDS)
    assert f"job {job!r} belongs to shard 1 of 2" in reply["error"] and "GPUMOND_SHARDS=2" in reply["error"]
    spec = httpx.get(f"{procs[0].url}/api/v1/openapi.json", timeout=5.0).json()  # the refusal is documented
    documented = spec["paths"]["/api/v1/push"]["post"]["responses"]["421"]["content"]["application/json"]["schema"]
    schema = spec["components"]["schemas"][documented["$ref"].rsplit("/", 1)[1]]
    assert set(reply) == set(schema["properties"]) and set(schema["required"]) <= set(reply)
    families = parse_metrics(httpx.get(f"{procs[0].url}/metrics", timeout=5.0).text)
    assert value(families, "gpumond_rules_push_misrouted_total", shard="1") == 1
    assert value(families, "gpumond_rules_push_requests_total", code="421") == 1
    assert value(families, "gpumond_rules_held", kind="jobs") == 3


def test_a_reporter_pointed_at_the_wrong_shard_drops_counts_and_goes_on(
        shards: tuple[int, list[RulesProcess]], caplog: pytest.LogCaptureFixture) -> None:
    _, procs = shards
    job = next(j for j in JOBS if shard_of(j, SHARDS) == 1)
    rep = _report(job, 0, procs[0].url, None)  # no {shard}: every push reaches shard 0
    rep.close(timeout_s=5)
    stats = rep.stats
    # the steps' push and the rank's heartbeats and final push are all refused (421); one warning says why
    assert (stats.pushed_steps, stats.dropped_steps) == (0, STEPS) and stats.failed_pushes >= 1, stats
    assert stats.last_error is not None and stats.last_error.startswith("HTTP 421: job ")
    warnings = [r.getMessage() for r in caplog.records if r.name == "gpumond.job"]
    assert len(warnings) == 1 and "GPUMOND_SHARDS" in warnings[0] and "{shard}" in warnings[0], warnings
