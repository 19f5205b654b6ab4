"""Every sink request has a total deadline: a receiver that drips its answer a byte at a time (each read well
inside httpx's per-read timeout) cannot hold a sink's worker past `timeout_s`."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from gpumond.alerts.sinks.base import Snapshot, WorkerSink

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 64\r\n\r\n"


class Dripper:
    """127.0.0.1 server: reads a request, then answers `head` at once and drips the rest a byte per `every_s`."""

    def __init__(self, head: bytes, drip: bytes, every_s: float = 0.25) -> None:
        self.head, self.drip, self.every_s = head, drip, every_s
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2.0)
                try:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += conn.recv(4096)
                    conn.sendall(self.head)
                    for byte in self.drip:
                        if self.stopping.wait(self.every_s):
                            return
                        conn.sendall(bytes([byte]))
                except OSError:
                    pass  # the client gave up: what the test wants


class Bare(WorkerSink):
    name = "bare"

    def step(self, snapshot: Snapshot, now: float) -> float | None:
        return None

    def depth(self) -> int:
        return 0


@pytest.fixture(params=["body", "headers"])
def dripper(request: pytest.FixtureRequest) -> Iterator[Dripper]:
    if request.param == "body":  # a 200 whose body never ends in time (the Slack stand-in of the report)
        d = Dripper(HEAD, b"x" * 64)
    else:  # the status line and headers themselves, a byte at a time
        d = Dripper(b"", HEAD + b"x" * 64)
    d.thread.start()
    yield d
    d.stopping.set()
    d.thread.join(5)
    d.sock.close()


def test_a_dripping_receiver_cannot_hold_a_request_past_its_deadline(dripper: Dripper) -> None:
    sink = Bare("127.0.0.1", timeout_s=1.0)
    try:
        t0 = time.monotonic()
        got = sink.post(f"http://127.0.0.1:{dripper.port}/hook", {"text": "x"})
        took = time.monotonic() - t0
    finally:
        sink.stop()
    assert got == "timed out (no complete answer within 1 s)"
    assert took < 2.0, f"held {took:.1f} s with timeout_s=1"  # the drip alone would take 16 s


def test_a_prompt_answer_is_read_whole() -> None:
    fast = Dripper(HEAD + b"y" * 64, b"", every_s=0)
    fast.thread.start()
    sink = Bare("127.0.0.1", timeout_s=1.0)
    try:
        for _ in range(3):  # no keep-alive: each request connects and is timed on its own
            got = sink.post(f"http://127.0.0.1:{fast.port}/hook", {"text": "x"})
            assert not isinstance(got, str) and got.status == 200 and got.body == "y" * 64
        time.sleep(1.2)  # a cancelled deadline fires on nothing
    finally:
        sink.stop()
        fast.stopping.set()
        fast.sock.close()
