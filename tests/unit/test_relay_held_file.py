"""What the relay could not deliver before it stopped is kept in its state directory and taken back at the next
start, once; a damaged file costs its bad records only."""

from __future__ import annotations

import json
import os
import threading

import httpx

from gpumond.agent.relay import HeldFile, Relay
from gpumond.agent.relay.buffer import Entry
from gpumond.config.agent import RelayConfig
from gpumond.web.client import Access
from tests.fakes import Deferred, FakeClock
from tests.push_bodies import encode


def down(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused")


def columnar(job: str, rank: int = 0) -> bytes:
    """A push as the relay holds one (the columnar body its intake writes), with one step."""
    raw = encode({"job": job, "rank": rank, "world_size": 8, "node": "n",
                  "gpu_uuid": "GPU-5b0c1234-aaaa-bbbb-cccc-012345678900",
                  "steps": [{"step": 0, "end": 1_763_760_000.0, "duration_s": 1.0, "data_wait_s": 0.1}]}, "columns")
    assert raw is not None
    return raw


def held_line(rank: int) -> bytes:
    """A columnar push body with no steps, as the relay holds one."""
    return b'{"job":"j","rank":%d,"world_size":8,"node":"n","gpu_uuid":"GPU-5b0c1234-aaaa-bbbb-cccc-012345678900",' \
           b'"columns":{"step":"","end":"","duration_s":"","data_wait_s":""}}' % rank


def relay(tmp_path, clock: FakeClock) -> Relay:
    return Relay(RelayConfig(upstream="http://127.0.0.1:9"), node="n", devices=dict, access=Access(), defer=Deferred(),
                 clock=clock,
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
    # Sent without an answer before the stop (the first; the shard was then paused): a "duplicate" from the service
    # later means it was stored then, not lost, which would have been reported to its rank.
    assert [e.attempts for e in back] == [1, 0, 0]
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
    assert list(tmp_path.iterdir()) == []  # read once, and no copy kept: it holds tokens


def test_a_stop_keeps_what_it_holds_when_the_service_never_answers_within_the_grace(tmp_path) -> None:
    """A rules service that takes the connection and never answers (hung, not refused), on several shards: the stop
    must not wait one client timeout per shard past its grace (the supervisor's SIGKILL would then take everything
    held), but keep what it holds and return."""
    release = threading.Event()

    def hung(request: httpx.Request) -> httpx.Response:
        release.wait(30)  # bounded: the test releases it at its end
        raise httpx.ReadTimeout("no answer", request=request)

    clock = FakeClock()
    r = Relay(RelayConfig(upstream="http://rules-{shard}:9481", shards=4), node="n", devices=dict, access=Access(),
              defer=Deferred(), clock=clock, client=httpx.Client(transport=httpx.MockTransport(hung)),
              held=HeldFile(tmp_path / "relay-held.json", clock))
    r.start()
    for job in ("a", "b", "c", "d", "e", "f"):
        r.buffer.add(Entry((job, None), (job, 0), columnar(job), 1, clock()))
    stopping = threading.Thread(target=r.stop, kwargs={"grace_s": 0.2})
    stopping.start()
    try:
        stopping.join(10)
        assert not stopping.is_alive(), "stop waits on an upstream that never answers"
    finally:
        release.set()
        stopping.join(30)
    kept = HeldFile(tmp_path / "relay-held.json", clock).load()
    assert sorted(e.rank[0] for e in kept) == ["a", "b", "c", "d", "e", "f"]
    assert all(e.attempts >= 1 for e in kept)  # any of them may have been in the batch still in flight


def test_a_damaged_held_file_leaves_no_readable_copy_of_the_tokens(tmp_path) -> None:
    """State files keep a bad record's file for a post-mortem, as a copy made with the process's umask (0644 in a
    container): this one holds the ranks' push tokens, so none of it may stay behind readable by others."""
    clock = FakeClock()
    good = {"job": "j", "rank": 0, "authorization": "Bearer rank-secret", "line": "{}", "steps": 1, "age_s": 0}
    path = tmp_path / "relay-held.json"
    path.write_text(json.dumps({"version": 1, "pushes": {"0": good, "1": {**good, "steps": "many"}}}))
    os.chmod(path, 0o600)
    r = relay(tmp_path, clock)
    r.start()
    assert [e.key for e in r.buffer.held()] == [("j", "Bearer rank-secret")]
    exposed = [p.name for p in tmp_path.iterdir() if os.stat(p).st_mode & 0o077 and b"rank-secret" in p.read_bytes()]
    assert exposed == []
    path.write_text("{not json")  # unusable as a whole: not read again at every start either
    relay(tmp_path, clock).start()
    assert not path.exists()


def test_a_held_file_as_large_as_its_buffer_allows_is_read_back(tmp_path) -> None:
    """What a full buffer writes, its lines JSON-escaped in the file (a quote is two bytes there), is read back: the
    64 MiB every other state file is read up to held less than a full buffer of the daemon's 64 MiB default, and the
    whole file was then set aside unread."""
    clock = FakeClock()
    bound = 40 * 2**20
    path = tmp_path / "relay-held.json"
    line = b'"' * 2**20
    kept = [Entry(("j", None), ("j", r), line, 1, clock()) for r in range(33)]  # 33 MiB held: a 66 MiB file
    assert sum(e.size for e in kept) <= bound
    assert HeldFile(path, clock, buffer_max_bytes=bound).save(kept)
    assert os.path.getsize(path) > 64 * 2**20
    back = HeldFile(path, clock, buffer_max_bytes=bound).load()
    assert [e.rank for e in back] == [("j", r) for r in range(33)] and back[-1].line == line
