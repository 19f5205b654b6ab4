"""What the SDK sends passes the rules service's own push validation, within its default limits.

A bridge until an end-to-end test runs `gpumond rules`: skipped while gpumond.rules.ingest is absent.
"""

from __future__ import annotations

import json

import pytest

from gpumond.job import Reporter
from gpumond.job.settings import MAX_LABEL_CHARS
from gpumond.job.transport import Reply

payload = pytest.importorskip("gpumond.rules.ingest.payload")
rules_config = pytest.importorskip("gpumond.config.rules")


class Capture:
    """Keeps the raw bodies."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def post(self, body: bytes, timeout_s: float) -> Reply:
        self.bodies.append(body)
        return Reply(202)

    def close(self) -> None:
        pass


def sdk_bodies(**kwargs: object) -> list[bytes]:
    """Bodies of a full default-size batch with the longest labels the SDK sends."""
    transport = Capture()
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
    return transport.bodies


def test_sdk_bodies_validate_under_the_service_defaults() -> None:
    limits = rules_config.LimitsConfig()
    model = payload.push_model(limits.max_string_len, limits.max_steps_per_push)
    bodies = sdk_bodies()
    assert [len(json.loads(b)["steps"]) for b in bodies] == [512, 1]
    assert MAX_LABEL_CHARS <= limits.max_string_len
    for body in bodies:
        assert len(body) <= limits.max_body_bytes
        push = payload.parse(model, body)  # raises PayloadError naming the field otherwise
        sent = json.loads(body)["steps"]
        # Only the contract's own field names: the service's internals are free to change.
        assert [(s.step, s.samples) for s in push.steps] == [(s["step"], s["samples"]) for s in sent]


def test_default_batch_size_fits_the_service_limit() -> None:
    import inspect

    default = inspect.signature(Reporter).parameters["max_steps_per_push"].default
    assert default <= rules_config.LimitsConfig().max_steps_per_push
