"""The relay's listener answers what a rank sends it, whatever the headers hold, without holding up the event loop
that serves every other listener of the agent."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable, Iterable, Mapping

import httpx
import pytest

from gpumond.agent.relay import Relay
from gpumond.config.agent import RelayConfig
from gpumond.web.client import Access
from gpumond.wire.media import PID_HEADER, PID_START_HEADER
from gpumond.wire.procstat import start_ticks
from tests.fakes import Deferred, FakeClock

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
NOW = 1_763_760_000.0


def push(rank: int = 0, **over: object) -> bytes:
    body = {"job": "j", "rank": rank, "world_size": 8,
            "steps": [{"step": 0, "end": NOW, "duration_s": 1.0, "data_wait_s": 0.1}], **over}
    return json.dumps(body).encode()


def relay(devices: Callable[[], Mapping[str, Iterable[int]]] = lambda: {GPU0: (4242,)}) -> Relay:
    return Relay(RelayConfig(upstream="http://127.0.0.1:9"), node="n", devices=devices, access=Access(),
                 defer=Deferred(), clock=FakeClock(),
                 client=httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(503))))


async def post(r: Relay, body: bytes, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=r.app), base_url="http://relay") as client:
        return await client.post("/api/v1/push", content=body, headers={"Content-Type": "application/json", **headers})


def send(r: Relay, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return asyncio.run(post(r, body, headers))


@pytest.mark.parametrize("pid", ["9" * 5000, "-1", "0x10", "", "99999999999999999999"],
                         ids=["5000 digits", "negative", "hex", "empty", "past 2**31"])
def test_an_unusable_pid_header_is_a_push_without_a_pid(pid: str) -> None:
    """Not a 500 with a traceback in the agent's log per push (int() refuses more than 4,300 digits)."""
    r = relay()
    answer = send(r, push(), {PID_HEADER: pid})
    assert answer.status_code == 422 and "GPUMOND_GPU_UUID" in answer.json()["error"]
    assert send(r, push(), {PID_HEADER: "4242"}).status_code == 202


def test_finding_a_rank_gpu_does_not_hold_up_the_event_loop() -> None:
    """NVML's process list is read under the session's lock, which the sampler holds for a whole sample (and a
    GPU falling off the bus can hold for seconds): the agent's other listeners (/healthz, /metrics) share the
    relay's event loop and must go on meanwhile."""
    loop_ran = threading.Event()
    waited: list[bool] = []

    def busy_nvml() -> dict[str, tuple[int, ...]]:
        waited.append(loop_ran.wait(5))  # bounded: 5 s only when the loop is held (the defect)
        return {GPU0: (4242,)}

    async def main() -> httpx.Response:
        async def other_listener() -> None:
            await asyncio.sleep(0.01)
            loop_ran.set()

        ticking = asyncio.create_task(other_listener())
        answer = await post(relay(busy_nvml), push(), {PID_HEADER: "4242"})
        await ticking
        return answer

    assert asyncio.run(main()).status_code == 202
    assert waited == [True]


def test_a_push_that_fits_only_by_dropping_what_is_being_sent_is_refused_for_a_retry_and_nothing_is_lost() -> None:
    r = relay()
    assert send(r, push(gpu_uuid=GPU0), {}).status_code == 202
    held = r.buffer.held()
    r.buffer.max_bytes = held[0].size  # the one held push fills the buffer
    in_flight = r.buffer.take(held[0].key, 1 << 20)
    answer = send(r, push(rank=1, gpu_uuid=GPU0), {})
    assert answer.status_code == 503 and "send again" in answer.json()["error"]
    assert r.buffer.held() == in_flight and r.stats.dropped == {} and r.stats.received == 1


def test_a_rank_is_placed_by_its_pid_and_start_time_as_the_sdk_sends_them() -> None:
    """Against this very process in the real /proc: the right start time finds its GPU, another one (a process in
    another container with the same pid) does not, and no start time (an SDK of before) finds it by pid alone."""
    me = os.getpid()
    started = start_ticks()
    assert started is not None
    r = relay(lambda: {GPU0: (me,)})
    assert send(r, push(), {PID_HEADER: str(me), PID_START_HEADER: str(started)}).status_code == 202
    assert send(r, push(), {PID_HEADER: str(me), PID_START_HEADER: str(started + 1)}).status_code == 422
    assert send(r, push(), {PID_HEADER: str(me)}).status_code == 202
    assert r.buffer.held()[0].line.count(GPU0.encode()) == 1
