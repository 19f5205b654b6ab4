"""The job SDK against a real HTTP receiver on 127.0.0.1 that checks every push against the contract.

The receiver stands in for the rules service's `POST /api/v1/push`: it can be made slow, down, or
answer 401 / 413 / 429 / 500. The last test pushes to the rules service itself (its app under uvicorn
on 127.0.0.1) and reads what its store holds. Every loop and wait here is bounded.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


from gpumond.config.rules import RulesConfig
from gpumond.job import Reporter, pusher
from gpumond.rules.http import build_app
from gpumond.rules.store import RankStore
from tests.integration.helpers import served
from tests.fakes import FakeClock

pytestmark = pytest.mark.integration

TOKEN = "test-token"
RULES_TOKEN = "rules-test-token-0123456789"  # the service wants at least 16 characters
WAIT_S = 10.0  # the longest any condition below may take
STEP_KEYS = ["step", "end", "duration_s", "data_wait_s", "samples"]
OPTIONAL_STEP_KEYS = ["comm_wait_s"]  # sent only when measured, after the others
TOP_KEYS = ["job", "rank", "world_size", "node", "gpu_uuid", "group", "incarnation", "steps"]
OPTIONAL_TOP_KEYS = ["final"]  # the rank's last push (end of job), sent by close()
GPU = "GPU-00000000-0000-4000-8000-000000000007"


def contract_errors(payload: object) -> list[str]:
    """Everything about a push body that the push API (docs/rules-api.md) does not allow, by field."""
    if not isinstance(payload, dict):
        return ["body: not an object"]
    errors = [f"{k}: unexpected or missing" for k in set(TOP_KEYS) ^ (set(payload) - set(OPTIONAL_TOP_KEYS))]
    if "final" in payload and payload["final"] is not True:
        errors.append("final: must be true when present")
    for key in ("job", "node", "gpu_uuid"):
        if not (isinstance(payload.get(key), str) and payload[key]):
            errors.append(f"{key}: must be a non-empty string")
    if payload.get("group") is not None and not isinstance(payload.get("group"), str):
        errors.append("group: must be a string or null")
    if payload.get("incarnation") is not None and not (isinstance(payload["incarnation"], str) and payload["incarnation"]):
        errors.append("incarnation: must be a non-empty string or null")
    rank, world = payload.get("rank"), payload.get("world_size")
    if not (_is_int(rank) and _is_int(world) and 0 <= rank < world):  # type: ignore[operator]
        errors.append("rank/world_size: need integers with 0 <= rank < world_size")
    steps = payload.get("steps")
    if not isinstance(steps, list):
        return errors + ["steps: must be a list"]
    # An empty list is a heartbeat (the process lives, nothing to report) or the final push.
    for i, step in enumerate(steps):
        if not isinstance(step, dict) or list(step)[:len(STEP_KEYS)] != STEP_KEYS \
                or not set(list(step)[len(STEP_KEYS):]) <= set(OPTIONAL_STEP_KEYS):
            errors.append(f"steps.{i}: keys must be {STEP_KEYS}, then optionally {OPTIONAL_STEP_KEYS}")
            continue
        if not (_is_int(step["step"]) and step["step"] >= 0):
            errors.append(f"steps.{i}.step: must be an integer >= 0")
        for key in ("end", "duration_s", "data_wait_s"):
            if not (_is_number(step[key]) and step[key] >= 0):
                errors.append(f"steps.{i}.{key}: must be a finite number >= 0")
        if _is_number(step["duration_s"]) and _is_number(step["data_wait_s"]) \
                and step["data_wait_s"] > step["duration_s"] + 1e-6:
            errors.append(f"steps.{i}.data_wait_s: longer than the step")
        if step["samples"] is not None and not (_is_int(step["samples"]) and step["samples"] >= 0):
            errors.append(f"steps.{i}.samples: must be an integer >= 0 or null")
        if "comm_wait_s" in step:
            comm = step["comm_wait_s"]
            if not (_is_number(comm) and comm >= 0):
                errors.append(f"steps.{i}.comm_wait_s: must be a finite number >= 0 when present")
            elif _is_number(step["duration_s"]) and _is_number(step["data_wait_s"]) \
                    and step["data_wait_s"] + comm > step["duration_s"] + 1e-6:
                errors.append(f"steps.{i}.comm_wait_s: the two waits are longer than the step")
    return errors


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


class Receiver:
    """A push endpoint on 127.0.0.1: validates, records, and misbehaves on request."""

    def __init__(self) -> None:
        self.mode = 202  # the status to answer: 202, or 401 / 413 / 429 / 500
        self.mode_count = math.inf  # answer `mode` this many more times, then 202
        self.max_steps = math.inf  # more steps than this in one push: 413
        self.delay_s = 0.0  # sleep before answering
        self.retry_after: str | None = None  # sent with 429 / 500
        self.drop_idle = False  # close the socket after answering, without saying so
        self.accepted: list[dict] = []
        self.markers: list[dict] = []  # pushes without steps: heartbeats, and the final push at close
        self.statuses: list[int] = []  # of the other requests
        self.request_times: list[float] = []
        self.violations: list[str] = []
        self.connections = 0
        self.port = 0
        self._live: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Receiver:
        """Listen (on the same port as before, after a stop)."""
        server = ThreadingHTTPServer(("127.0.0.1", self.port), _Handler)
        server.daemon_threads = True
        server.receiver = self  # type: ignore[attr-defined]
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening and cut every open connection, as a crashed service would."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            live = list(self._live)
        for conn in live:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def steps(self) -> list[dict]:
        with self._lock:
            return [s for p in self.accepted for s in p["steps"]]

    def answer(self, headers: dict[str, str], body: bytes, path: str) -> tuple[int, dict[str, str], bytes]:
        """Decide the reply to one request."""
        if self.delay_s:
            time.sleep(self.delay_s)
        with self._lock:
            status, extra, reply = self._decide(headers, body, path)
            if status == 202 and self.accepted and self.accepted[-1].get("steps") == []:
                self.markers.append(self.accepted.pop())
            else:
                self.request_times.append(time.monotonic())
                self.statuses.append(status)
        return status, extra, json.dumps(reply).encode()

    def _decide(self, headers: dict[str, str], body: bytes, path: str) -> tuple[int, dict[str, str], dict]:
        if path != "/api/v1/push":
            return 404, {}, {"detail": "not found"}
        if headers.get("Authorization") != f"Bearer {TOKEN}":
            return 401, {}, {"detail": "missing or invalid bearer token"}
        if self.mode != 202 and self.mode_count > 0:
            self.mode_count -= 1
            extra = {"Retry-After": self.retry_after} if self.retry_after else {}
            return self.mode, extra, {"detail": f"told to answer {self.mode}"}
        try:
            payload = json.loads(body)
        except ValueError:
            self.violations.append("body: not JSON")
            return 400, {}, {"detail": "body: not JSON"}
        errors = contract_errors(payload)
        if errors:
            self.violations += errors
            return 422, {}, {"detail": errors[0]}
        if len(payload["steps"]) > self.max_steps:
            return 413, {}, {"detail": f"steps: more than {self.max_steps}"}
        self.accepted.append(payload)
        return 202, {}, {"accepted": len(payload["steps"])}

    def opened(self, conn: socket.socket) -> None:
        with self._lock:
            self.connections += 1
            self._live.add(conn)

    def closed(self, conn: socket.socket) -> None:
        with self._lock:
            self._live.discard(conn)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real service speaks

    def setup(self) -> None:
        super().setup()
        self.server.receiver.opened(self.connection)  # type: ignore[attr-defined]

    def finish(self) -> None:
        self.server.receiver.closed(self.connection)  # type: ignore[attr-defined]
        super().finish()

    def do_POST(self) -> None:  # noqa: N802 — http.server's naming
        receiver: Receiver = self.server.receiver  # type: ignore[attr-defined]
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        status, extra, reply = receiver.answer(dict(self.headers), body, self.path)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        for key, value in extra.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(reply)
        if receiver.drop_idle:
            self.close_connection = True  # without a "Connection: close": the client finds out on reuse

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 — quiet
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    recv = Receiver().start()
    yield recv
    recv.stop()
    assert recv.violations == []


@pytest.fixture
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pusher, "BACKOFF_BASE_S", 0.02)
    monkeypatch.setattr(pusher, "BACKOFF_CAP_S", 0.1)


def reporter(recv: Receiver, **kwargs: object) -> Reporter:
    args: dict[str, object] = dict(endpoint=recv.url, token=TOKEN, job="job-7", rank=2, world_size=4,
                                   node="node-b", gpu_uuid=GPU, group="stage-1", push_interval_s=0.02,
                                   timeout_s=2.0)
    args.update(kwargs)
    rep = Reporter(**args)  # type: ignore[arg-type]
    assert rep.enabled, rep.stats.last_error
    return rep


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.01)


# ----- the happy path -------------------------------------------------------------------------------
def test_steps_arrive_with_the_right_numbers_over_one_connection(receiver: Receiver) -> None:
    clock = FakeClock(50.0)
    rep = reporter(receiver, clock=clock, wall=lambda: clock.now + 1_763_760_000.0)

    def batches(n: int) -> Iterator[int]:
        for i in range(n):
            clock.now += 0.01 * (i % 3)  # blocked in the loader
            yield i

    expected = []
    for chunk in range(3):  # three chunks, each pushed before the next: several pushes, one connection
        for i in rep.wrap(batches(20)):
            clock.now += 0.5
            rep.step_end(samples=32)
            expected.append((chunk * 20 + i, 1_763_760_000.0 + clock.now, 0.5 + 0.01 * (i % 3), 0.01 * (i % 3)))
        wait_for(lambda n=len(expected): len(receiver.steps()) == n, f"{len(expected)} steps")
    rep.close()
    got = [(s["step"], s["end"], s["duration_s"], s["data_wait_s"]) for s in receiver.steps()]
    assert got == [pytest.approx(e, abs=1e-6) for e in expected]
    assert all(s["samples"] == 32 for s in receiver.steps())
    first = receiver.accepted[0]
    assert {k: first[k] for k in TOP_KEYS[:-1]} == {"job": "job-7", "rank": 2, "world_size": 4, "node": "node-b",
                                                    "gpu_uuid": GPU, "group": "stage-1",
                                                    "incarnation": rep.incarnation}
    assert len(receiver.accepted) >= 3 and receiver.connections == 1
    assert rep.stats.pushed_steps == 60 and rep.stats.dropped_steps == 0 and rep.stats.failed_pushes == 0


def test_a_kept_alive_socket_closed_by_the_server_is_reopened_without_a_failure(receiver: Receiver) -> None:
    receiver.drop_idle = True
    rep = reporter(receiver)
    for n in (1, 2, 3):
        rep.step_end()
        wait_for(lambda n=n: len(receiver.steps()) == n, f"step {n}")
        time.sleep(0.05)  # let the server's close land before the next push reuses the socket
    rep.close()
    # Each request finds its socket closed; heartbeats in between are requests too.
    assert rep.stats.failed_pushes == 0 and receiver.connections == 3 + len(receiver.markers)
    assert receiver.markers[-1]["final"] is True


def test_comm_waits_arrive_only_for_steps_that_measured_them(receiver: Receiver) -> None:
    clock = FakeClock(50.0)
    rep = reporter(receiver, clock=clock, wall=lambda: clock.now + 1_763_760_000.0, push_interval_s=3600)
    for i in rep.wrap(range(4)):
        clock.now += 0.5
        if i >= 2:
            with rep.comm_wait():  # the all-reduce: this rank waited 0.25 s for the others
                clock.now += 0.25
        rep.step_end(comm_wait_s=0.125 if i == 3 else None)
    rep.close()
    steps = receiver.steps()
    assert [list(s) for s in steps] == [STEP_KEYS] * 2 + [STEP_KEYS + ["comm_wait_s"]] * 2
    assert [s.get("comm_wait_s") for s in steps] == [None, None, 0.25, 0.125]


# ----- the service misbehaving ----------------------------------------------------------------------
def test_receiver_down_training_runs_at_full_speed_and_drops_are_counted(receiver: Receiver) -> None:
    receiver.stop()
    rep = reporter(receiver, max_queue=1000)
    n = 50_000
    started = time.perf_counter()
    for _ in rep.wrap(range(n)):
        rep.step_end(samples=1)
    elapsed = time.perf_counter() - started
    assert elapsed < 2.5, f"{n} steps took {elapsed:.2f}s"  # ~50 µs a step at worst; ~2 µs is typical
    closing = time.monotonic()
    rep.close(timeout_s=0.5)
    assert time.monotonic() - closing < 2.0
    stats = rep.stats
    assert (stats.pushed_steps, stats.dropped_steps, stats.queue_len) == (0, n, 0)
    assert stats.failed_pushes >= 1 and "Connection" in (stats.last_error or "")


def test_pushes_resume_when_the_receiver_comes_back(receiver: Receiver, fast_backoff: None,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpumond.job")
    receiver.stop()
    rep = reporter(receiver)
    for _ in rep.wrap(range(100)):
        pass
    wait_for(lambda: rep.stats.failed_pushes >= 2, "failed pushes")
    receiver.start()
    wait_for(lambda: len(receiver.steps()) == 100, "100 steps after the restart")
    rep.close()
    assert [s["step"] for s in receiver.steps()] == list(range(100))
    assert rep.stats.pushed_steps == 100 and rep.stats.dropped_steps == 0
    messages = [r.getMessage() for r in caplog.records]
    assert any("retrying" in m for m in messages) and any("resumed" in m for m in messages)


def test_401_is_dropped_not_retried_and_warned_once(receiver: Receiver,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gpumond.job")
    rep = reporter(receiver, token="wrong-token")
    for n in (10, 20, 30):
        for _ in range(10):
            rep.step_end()
        wait_for(lambda n=n: rep.stats.dropped_steps == n, f"{n} dropped")
    rep.close()
    stats = rep.stats
    assert stats.pushed_steps == 0 and stats.dropped_steps == 30
    assert stats.failed_pushes == len(receiver.statuses) and set(receiver.statuses) == {401}
    warnings = [r.getMessage() for r in caplog.records if "401" in r.getMessage()]
    assert len(warnings) == 1 and "wrong-token" not in warnings[0]


def test_slow_receiver_does_not_slow_the_training_loop(receiver: Receiver) -> None:
    def train(rep: Reporter | None, steps: int) -> tuple[float, float]:
        """Total and longest step of a loop doing ~2 ms of work a step."""
        longest, started = 0.0, time.perf_counter()
        data = range(steps) if rep is None else rep.wrap(range(steps))
        for _ in data:
            t0 = time.perf_counter()
            time.sleep(0.002)
            longest = max(longest, time.perf_counter() - t0)
        return time.perf_counter() - started, longest

    bare, _ = train(None, 200)
    receiver.delay_s = 0.5
    rep = reporter(receiver, push_interval_s=0.01)
    total, longest = train(rep, 200)
    assert receiver.connections >= 1  # a push was in flight meanwhile
    assert longest < 0.25, f"a step took {longest:.3f}s: it waited on the receiver"
    assert total < 1.5 * bare + 0.2, f"{total:.2f}s with a slow receiver vs {bare:.2f}s bare"
    rep.close(timeout_s=5)
    assert rep.stats.pushed_steps == 200 and rep.stats.dropped_steps == 0


def test_429_waits_as_long_as_retry_after_says(receiver: Receiver, fast_backoff: None) -> None:
    receiver.mode, receiver.mode_count, receiver.retry_after = 429, 1, "1"
    rep = reporter(receiver)
    rep.step_end()
    wait_for(lambda: len(receiver.steps()) == 1, "the step after the 429")
    rep.close()
    assert receiver.statuses == [429, 202]
    first, second = receiver.request_times
    assert second - first >= 0.95  # not the 20 ms the (shortened) backoff alone would give
    assert rep.stats.failed_pushes == 1 and rep.stats.pushed_steps == 1


def test_500_is_retried_with_backoff_until_it_succeeds(receiver: Receiver, fast_backoff: None) -> None:
    receiver.mode, receiver.mode_count = 500, 3
    rep = reporter(receiver)
    for _ in range(5):
        rep.step_end()
    wait_for(lambda: len(receiver.steps()) == 5, "5 steps after three 500s")
    rep.close()
    assert receiver.statuses[:3] == [500, 500, 500]
    assert [s["step"] for s in receiver.steps()] == [0, 1, 2, 3, 4]  # each exactly once
    assert rep.stats.failed_pushes == 3 and rep.stats.dropped_steps == 0


def test_413_drops_the_batch_and_later_pushes_are_smaller(receiver: Receiver,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gpumond.job")
    receiver.max_steps = 100
    rep = reporter(receiver, push_interval_s=3600, max_steps_per_push=400)  # pushes only at close
    for _ in range(700):
        rep.step_end()
    rep.close()
    # 400 → 413, halve; 200 → 413, halve; 100 fits.
    assert receiver.statuses == [413, 413, 202]
    assert [s["step"] for s in receiver.steps()] == list(range(600, 700))
    assert rep.stats.dropped_steps == 600 and rep.stats.pushed_steps == 100
    assert sum("HTTP 413" in r.getMessage() for r in caplog.records) == 1


# ----- the rules service itself -------------------------------------------------------------------------
@pytest.fixture
def rules_service() -> Iterator[tuple[str, RankStore]]:
    """The rules service's app under uvicorn on 127.0.0.1 (port 0, bound first): its URL and its store."""
    config = RulesConfig.model_validate({"tokens": [RULES_TOKEN]})
    store = RankStore.from_config(config)
    app = build_app(config=config, rank_store=store, findings=lambda: [], metrics=lambda: b"",
                    ready=lambda: (True, "ready"), clock=time.time)
    with served(app) as url:
        yield url, store


@pytest.mark.parametrize("encoding", ["json", "columns"])
def test_comm_waits_reach_the_rules_service_store(rules_service: tuple[str, RankStore], encoding: str) -> None:
    url, store = rules_service
    clock = FakeClock(50.0)
    started_wall = time.time() - 60.0  # the steps ended a minute ago: inside the window, not in the future
    rep = Reporter(endpoint=url, token=RULES_TOKEN, job="job-7", rank=1, world_size=2, node="node-b", gpu_uuid=GPU,
                   push_interval_s=0.02, clock=clock, wall=lambda: clock.now - 50.0 + started_wall, encoding=encoding)
    assert rep.enabled, rep.stats.last_error
    for i in rep.wrap(range(3)):
        clock.now += 0.5
        if i:
            with rep.comm_wait():
                clock.now += 0.25 * i
        rep.step_end(samples=8)
    wait_for(lambda: rep.stats.pushed_steps == 3, "3 steps pushed")
    window = store.jobs(time.time())["job-7"][1]
    # samples are validated but not held (nothing reads them): the store keeps columns of what detectors use
    assert [(s.step, s.comm_wait_s) for s in window.steps] == [(0, None), (1, 0.25), (2, 0.5)]
    assert [s.duration_s for s in window.steps] == [0.5, 0.75, 1.0]
    rep.close()
    assert rep.stats.failed_pushes == 0, rep.stats.last_error
    assert "job-7" not in store.jobs(time.time())  # its only rank said it ended: the job is released


def _run(url: str, steps: int, duration_s: float, wall: Callable[[], float]) -> Reporter:
    """A training process: `steps` steps of job-8 rank 0 numbered from 0, pushed to the rules service."""
    clock = FakeClock(50.0)
    rep = Reporter(endpoint=url, token=RULES_TOKEN, job="job-8", rank=0, world_size=1, node="node-c", gpu_uuid=GPU,
                   push_interval_s=0.02, clock=clock, wall=lambda: clock.now + wall())
    assert rep.enabled, rep.stats.last_error
    for _ in rep.wrap(range(steps)):
        clock.now += duration_s
        rep.step_end()
    wait_for(lambda: rep.stats.pushed_steps + rep.stats.dropped_steps == steps, f"{steps} steps answered")
    return rep  # not closed: close() sends the final push, which releases a job whose ranks all ended


def test_a_restarted_process_reusing_step_numbers_has_its_steps_stored(rules_service) -> None:
    # A torchelastic restart: same job, rank and TORCHELASTIC_RUN_ID, steps numbered again from 0.
    url, store = rules_service
    first = _run(url, 200, 0.5, lambda: time.time() - 200.0)
    first._pusher.close(1.0)  # the process dies without its final push (a crash torchelastic restarts)
    second = _run(url, 200, 0.25, lambda: time.time() - 100.0)
    held = store.jobs(time.time())["job-8"][0].steps
    assert len(held) == 200 and {s.duration_s for s in held} == {0.25}  # the restarted process's steps
    assert (second.stats.pushed_steps, second.stats.dropped_steps) == (200, 0), second.stats
    assert first.incarnation != second.incarnation
    second.close()


def test_a_rank_whose_clock_is_behind_the_window_is_told_and_counts_its_steps_dropped(
        rules_service, caplog: pytest.LogCaptureFixture) -> None:
    url, _ = rules_service
    caplog.set_level(logging.WARNING, logger="gpumond.job")
    rep = _run(url, 50, 0.5, lambda: time.time() - 10_000.0)  # more than window_s (300 s) behind
    assert (rep.stats.pushed_steps, rep.stats.dropped_steps) == (0, 50), rep.stats
    assert dict(rep.stats.dropped_by_service) == {"stale": 50}
    warned = [r.getMessage() for r in caplog.records if "did not store" in r.getMessage()]
    assert len(warned) == 1 and "clock" in warned[0]
    rep.close()


# ----- end of job and heartbeats ----------------------------------------------------------------------------
def test_an_idle_rank_sends_heartbeats_and_close_sends_the_final_push(receiver: Receiver) -> None:
    rep = reporter(receiver, push_interval_s=0.05)
    rep.step_end()
    wait_for(lambda: len(receiver.steps()) == 1, "the step")
    wait_for(lambda: len(receiver.markers) >= 3, "three heartbeats while nothing is to report")
    assert all("final" not in m and m["steps"] == [] for m in receiver.markers)
    rep.close()
    assert receiver.markers[-1]["final"] is True and receiver.markers[-1]["job"] == "job-7"
    assert rep.stats.failed_pushes == 0 and rep.stats.dropped_steps == 0


_CHILD = """
import signal, sys, time
from gpumond.job import Reporter
rep = Reporter(endpoint=sys.argv[1], token=sys.argv[2], job="job-9", rank=0, world_size=1, node="node-c",
               gpu_uuid=sys.argv[3], push_interval_s=3600)
assert rep.enabled, rep.stats.last_error
if sys.argv[4] == "own-handler":
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))
rep.step_end()
if sys.argv[4] == "exit":
    sys.exit(0)  # no close(): atexit does it
print("ready", flush=True)
while True:
    time.sleep(0.05)  # training; torchrun's teardown SIGTERMs it
"""


@pytest.mark.parametrize("how, code", [("exit", 0), ("sigterm", -15), ("own-handler", 7)])
def test_the_final_push_is_sent_at_exit_and_on_sigterm_and_a_program_handler_is_kept(
        receiver: Receiver, how: str, code: int) -> None:
    import subprocess
    import sys
    child = subprocess.Popen([sys.executable, "-c", _CHILD, receiver.url, TOKEN, GPU, how], stdout=subprocess.PIPE)
    try:
        if how != "exit":
            assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
            child.send_signal(15)
        assert child.wait(timeout=WAIT_S) == code  # still dies of SIGTERM: the launcher sees what it sent
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    # The step, then the final push (the program's own handler exits through sys.exit: atexit sends it too).
    assert [s["step"] for s in receiver.steps()] == [0]
    assert [m.get("final") for m in receiver.markers] == [True]
