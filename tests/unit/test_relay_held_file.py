"""What the relay could not deliver before it stopped is kept in its state directory and taken back at the next
start, once; a damaged file costs its bad records only."""

from __future__ import annotations

import json
import os

import httpx

from gpumond.agent.relay import HeldFile, Relay
from gpumond.agent.relay.buffer import Entry
from gpumond.config.agent import RelayConfig
from gpumond.web.client import Access
from tests.fakes import FakeClock


def down(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused")


def held_line(rank: int) -> bytes:
    """A columnar push body with no steps, as the relay holds one."""
    return b'{"job":"j","rank":%d,"world_size":8,"node":"n","gpu_uuid":"GPU-5b0c1234-aaaa-bbbb-cccc-012345678900",' \
           b'"columns":{"step":"","end":"","duration_s":"","data_wait_s":""}}' % rank


def relay(tmp_path, clock: FakeClock) -> Relay:
    return Relay(RelayConfig(upstream="http://127.0.0.1:9"), node="n", devices=dict, access=Access(), clock=clock,
                 client=httpx.Client(transport=httpx.MockTransport(down)),
                 held=HeldFile(tmp_path / "relay-held.json", clock))


def test_a_relay_stopped_while_the_service_is_down_keeps_its_pushes_for_the_next_start(tmp_path) -> None:
    clock = FakeClock()
    first = relay(tmp_path, clock)
    first.start()
    for rank in range(3):
        first.buffer.add(Entry(("j", f"Bearer t{rank}"), ("j", rank), held_line(rank), 2, clock()))
    clock.advance(5)
    first.stop(grace_s=0.05)
    path = tmp_path / "relay-held.json"
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"  # it holds the ranks' tokens
    second = relay(tmp_path, clock)
    second.start()
    back = second.buffer.held()
    assert [(e.key, e.rank, e.line, e.steps) for e in back] == [
        (("j", f"Bearer t{r}"), ("j", r), held_line(r), 2) for r in range(3)]
    assert second.buffer.oldest_age() == 5  # aged as it was
    assert not path.exists()  # taken back once
    third = relay(tmp_path, clock)
    third.start()
    assert third.buffer.count == 0


def test_a_bad_record_is_left_out_and_the_rest_taken_back(tmp_path) -> None:
    clock = FakeClock()
    good = {"job": "j", "rank": 0, "authorization": None, "line": "{}", "steps": 1, "age_s": 0}
    (tmp_path / "relay-held.json").write_text(json.dumps(
        {"version": 1, "pushes": {"0": good, "1": {**good, "steps": "many"}}}))
    r = relay(tmp_path, clock)
    r.start()
    assert [e.rank for e in r.buffer.held()] == [("j", 0)]
    assert list(tmp_path.glob("relay-held.json.rejected.*"))
