"""What the SDK sends passes the rules service's own push validation, within its default limits.

A bridge until an end-to-end test runs `gpumond rules`: skipped while gpumond.rules.ingest is absent.
"""

from __future__ import annotations

import json
import random

import pytest

from gpumond.identity import MAX_LABEL_CHARS
from gpumond.job import Reporter
from gpumond.job.payload import encode, encode_head
from tests.fakes import FakeClock, FakeTransport

payload = pytest.importorskip("gpumond.rules.ingest.payload")
rules_config = pytest.importorskip("gpumond.config.rules")


def sdk_bodies(**kwargs: object) -> list[bytes]:
    """Bodies of a full default-size batch with the longest labels the SDK sends."""
    transport = FakeTransport()
    args: dict[str, object] = dict(job="j" * 500, rank=65_534, world_size=65_535, node="n" * 500,
                                   gpu_uuid="GPU-5B0C1A2E-3F4D-4E5F-8A9B-0C1D2E3F4A5B", group="g" * 500,
                                   transport=transport, push_interval_s=3600)
    args.update(kwargs)
    rep = Reporter(**args)  # type: ignore[arg-type]
    assert rep.enabled
    for i in rep.wrap(range(512)):
        rep.step_end(samples=2**40 + i, step=10**12 + i)
    rep.step_end()  # and one without samples
    rep.close()
    return transport.raw


def test_sdk_bodies_validate_under_the_service_defaults() -> None:
    limits = rules_config.LimitsConfig()
    model = payload.push_model(limits.max_string_len, limits.max_steps_per_push)
    bodies = sdk_bodies()
    assert [len(json.loads(b)["steps"]) for b in bodies] == [512, 1, 0]
    assert payload.parse(model, bodies[-1]).final and not payload.parse(model, bodies[0]).final
    assert MAX_LABEL_CHARS <= limits.max_string_len
    for body in bodies:
        assert len(body) <= limits.max_body_bytes
        push = payload.parse(model, body)  # raises PayloadError naming the field otherwise
        sent = json.loads(body)["steps"]
        # Only the contract's own field names: the service's internals are free to change.
        assert [(s.step, s.samples) for s in push.steps] == [(s["step"], s["samples"]) for s in sent]


def test_sdk_comm_waits_reach_the_service_model_and_are_absent_when_not_measured() -> None:
    limits = rules_config.LimitsConfig()
    model = payload.push_model(limits.max_string_len, limits.max_steps_per_push)
    clock, transport = FakeClock(), FakeTransport()
    rep = Reporter(job="j", rank=0, world_size=2, node="n", gpu_uuid="GPU-5B0C1A2E-3F4D-4E5F-8A9B-0C1D2E3F4A5B",
                   transport=transport, push_interval_s=3600, clock=clock, wall=lambda: clock.now + 1.7e9)

    def fetches():
        for i in range(4):
            clock.now += 0.125
            yield i

    for i in rep.wrap(fetches()):
        clock.now += 0.5
        if i % 2:
            with rep.comm_wait():
                clock.now += 0.25
        rep.step_end()
    clock.now += 0.5
    rep.step_end(comm_wait_s=99.0)  # longer than the step: cut to it
    rep.close()
    body, _final = transport.raw
    assert [("comm_wait_s" in s) for s in json.loads(body)["steps"]] == [False, True, False, True, True]
    push = payload.parse(model, body)
    assert [s.comm_wait_s for s in push.steps] == [None, 0.25, None, 0.25, pytest.approx(0.5, abs=2e-6)]


def test_comm_waits_that_fill_the_step_survive_rounding_to_the_service() -> None:
    # Every combination of step duration, data wait and a comm wait up to (and past) what is left of the
    # step, rounded to microseconds by the encoder, must pass the service's sum check (1 µs slack).
    model = payload.push_model(64, 512)
    head = encode_head({"job": "j", "rank": 0, "world_size": 1, "node": "n",
                        "gpu_uuid": "GPU-5b0c1a2e-3f4d-4e5f-8a9b-0c1d2e3f4a5b", "group": None})
    rng = random.Random(7)
    for _ in range(40):
        records = []
        for i in range(512):
            duration = rng.choice([rng.uniform(0, 2e-6), rng.uniform(0, 1), rng.uniform(0, 86_400)])
            wait = duration * rng.choice([0.0, rng.random(), 1.0])
            comm = (duration - wait) + rng.choice([0.0, -1.5e-6, -5e-7, 5e-7, 1.5e-6, rng.uniform(-1, 1) * 1e-6])
            records.append((i, 1000.0 + i, duration, wait, None, max(comm, 0.0)))
        push = payload.parse(model, encode(head, records, 1.7e9, 1000.0))  # raises PayloadError if refused
        assert all(0 <= s.comm_wait_s <= s.duration_s - s.data_wait_s + 1e-6 for s in push.steps)


def test_default_batch_size_fits_the_service_limit() -> None:
    import inspect

    default = inspect.signature(Reporter).parameters["max_steps_per_push"].default
    assert default <= rules_config.LimitsConfig().max_steps_per_push
