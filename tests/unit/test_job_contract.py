"""What the SDK sends passes the rules service's own push validation, within its default limits.

A bridge until an end-to-end test runs `gpumond rules`: skipped while gpumond.rules.ingest is absent.
"""

from __future__ import annotations

import random

import pytest

from gpumond.job import Reporter
from gpumond.job.payload import encode, encode_columns, encode_head
from gpumond.wire.identity import MAX_LABEL_CHARS
from tests.fakes import FakeClock, FakeTransport
from tests.push_bodies import ENCODINGS, steps_of

payload = pytest.importorskip("gpumond.push.body")
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


def service_model(encoding: str, limits=None):
    limits = limits or rules_config.LimitsConfig()
    make = payload.push_model if encoding == "json" else payload.columns_model
    return make(limits.max_string_len, limits.max_steps_per_push)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_sdk_bodies_validate_under_the_service_defaults(encoding: str) -> None:
    limits = rules_config.LimitsConfig()
    model = service_model(encoding, limits)
    bodies = sdk_bodies(encoding=encoding)
    assert [len(steps_of(b)) for b in bodies] == [512, 1, 0]
    assert payload.parse(model, bodies[-1]).final and not payload.parse(model, bodies[0]).final
    assert MAX_LABEL_CHARS <= limits.max_string_len
    for body in bodies:
        assert len(body) <= limits.max_body_bytes
        push = payload.parse(model, body)  # raises PayloadError naming the field otherwise
        sent = steps_of(body)
        assert push.step_columns().step.tolist() == [s["step"] for s in sent]
        if len(sent) == 512:
            assert [s["samples"] for s in sent] == [2**40 + i for i in range(512)]
        if encoding == "json":  # only the contract's own field names: the service's internals are free to change
            assert [(s.step, s.samples) for s in push.steps] == [(s["step"], s["samples"]) for s in sent]


def test_a_bad_push_encoding_disables_the_reporter_with_one_line() -> None:
    rep = Reporter(job="j", rank=0, world_size=1, node="n", gpu_uuid="GPU-5B0C1A2E-3F4D-4E5F-8A9B-0C1D2E3F4A5B",
                   transport=FakeTransport(), encoding="msgpack")
    assert not rep.enabled


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_sdk_comm_waits_reach_the_service_model_and_are_absent_when_not_measured(encoding: str) -> None:
    model = service_model(encoding)
    clock, transport = FakeClock(), FakeTransport()
    rep = Reporter(job="j", rank=0, world_size=2, node="n", gpu_uuid="GPU-5B0C1A2E-3F4D-4E5F-8A9B-0C1D2E3F4A5B",
                   transport=transport, push_interval_s=3600, clock=clock, wall=lambda: clock.now + 1.7e9,
                   encoding=encoding)

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
    assert [("comm_wait_s" in s) for s in steps_of(body)] == [False, True, False, True, True]
    comm = payload.parse(model, body).step_columns().comm_wait_s.tolist()
    assert [None if c != c else c for c in comm] == [None, 0.25, None, 0.25, pytest.approx(0.5, abs=2e-6)]


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_comm_waits_that_fill_the_step_survive_rounding_to_the_service(encoding: str) -> None:
    # Every combination of step duration, data wait and a comm wait up to (and past) what is left of the
    # step, rounded to microseconds by the JSON encoder (exact in columns), must pass the service's sum check
    # (1 µs slack).
    model = (payload.push_model if encoding == "json" else payload.columns_model)(64, 512)
    head = encode_head({"job": "j", "rank": 0, "world_size": 1, "node": "n",
                        "gpu_uuid": "GPU-5b0c1a2e-3f4d-4e5f-8a9b-0c1d2e3f4a5b", "group": None}, encoding)
    encoder = encode if encoding == "json" else encode_columns
    rng = random.Random(7)
    for _ in range(40):
        records = []
        for i in range(512):
            duration = rng.choice([rng.uniform(0, 2e-6), rng.uniform(0, 1), rng.uniform(0, 86_400)])
            wait = duration * rng.choice([0.0, rng.random(), 1.0])
            comm = (duration - wait) + rng.choice([0.0, -1.5e-6, -5e-7, 5e-7, 1.5e-6, rng.uniform(-1, 1) * 1e-6])
            records.append((i, 1000.0 + i, duration, wait, None, max(comm, 0.0)))
        push = payload.parse(model, encoder(head, records, 1.7e9, 1000.0))  # raises PayloadError if refused
        c = push.step_columns()
        assert ((0 <= c.comm_wait_s) & (c.comm_wait_s <= c.duration_s - c.data_wait_s + 1e-6)).all()


def test_default_batch_size_fits_the_service_limit() -> None:
    import inspect

    default = inspect.signature(Reporter).parameters["max_steps_per_push"].default
    assert default <= rules_config.LimitsConfig().max_steps_per_push


@pytest.mark.parametrize("encoder", [encode, encode_columns], ids=["json", "columns"])
@pytest.mark.parametrize("bad", [(1, float("inf"), 0.5, 0.0, None), (1, 10.0, float("nan"), 0.0, None, 0.1),
                                 (1, 10.0, 0.5, float("-inf"), 4)])
def test_both_encoders_refuse_a_non_finite_time_naming_the_step(encoder, bad) -> None:
    head = encode_head({"job": "j", "rank": 0, "world_size": 1, "node": "n",
                        "gpu_uuid": "GPU-5b0c1a2e-3f4d-4e5f-8a9b-0c1d2e3f4a5b", "group": None},
                       "json" if encoder is encode else "columns")
    with pytest.raises(ValueError, match="step 1 has a non-finite time"):
        encoder(head, [(0, 9.0, 0.5, 0.0, None), bad], 1.7e9, 0.0)
