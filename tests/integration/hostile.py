"""What a hostile network sends a daemon, as reusable pieces: a bounded slow-loris client, raw HTTP requests,
and a generator of hostile pushes (malformed JSON, lying lengths, deep nesting, NaN and huge numbers, control
characters, label floods to every cap). Used by the integration tests.

Everything talks to 127.0.0.1 only, and every loop and wait is bounded.
"""

from __future__ import annotations

import json
import math
import random
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.push_bodies import CONTENT_TYPES, encode, pack

UUID_FMT = "GPU-{:08x}-0000-4000-8000-{:012x}"


def rss_bytes(pid: int) -> int:
    """Resident set size of process `pid` (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def raw_request(port: int, data: bytes, *, timeout: float = 5.0, half_close: bool = True) -> int | None:
    """Send `data` as is; the response's status code, or None when the server closed without one."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)  # a lying Content-Length then meets EOF, not a wait
            head = b""
            while b"\r\n" not in head:
                chunk = s.recv(4096)
                if not chunk:
                    break
                head += chunk
    except (ConnectionResetError, BrokenPipeError):
        return None
    if not head.startswith(b"HTTP/1.1 "):
        return None
    return int(head[9:12])


def post(path: str, body: bytes, token: str | None, *, headers: dict[str, str] | None = None,
         content_length: str | None = None, content_type: str = "application/json") -> bytes:
    """A raw POST; `content_length` overrides the honest one (a lie, or garbage)."""
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close", f"Content-Type: {content_type}"]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    lines.append(f"Content-Length: {len(body) if content_length is None else content_length}")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


_post = post  # hostile_requests sends every body with its encoding's Content-Type through this


def valid_push(job: str = "job", rank: int = 0, gpu: int = 0, steps: int = 2, first: int = 0,
               world: int = 1_000_000) -> dict:
    now = time.time()
    return {"job": job, "rank": rank, "world_size": world, "node": "node-1", "gpu_uuid": UUID_FMT.format(gpu, gpu),
            "steps": [{"step": first + i, "end": now - 1, "duration_s": 1.0, "data_wait_s": 0.1}
                      for i in range(steps)]}


def hostile_requests(token: str, *, seed: int = 13, floods: dict[str, int] | None = None,
                     movable_ranks: int = 50, held_jobs: int = 20,
                     encoding: str = "json") -> Iterator[tuple[str, bytes, bool]]:
    """(kind, raw request, half_close) for the push API: every kind of hostile input, then label floods.

    `floods` says how many distinct jobs / ranks / GPUs / steps to push (past the service's caps). The GPU
    flood moves ranks 0..movable_ranks-1 of job "job" (held after the rank flood) to new GPUs; the step flood
    pushes 1,000 steps to rank 0 of each job the job flood left held (held_jobs), one push per rank first.
    `encoding`: the push encoding of every body (tests/push_bodies.py); the columnar one adds hostile columns.
    """
    rng = random.Random(seed)
    path = "/api/v1/push"

    def p_body(push: dict) -> bytes:
        raw = encode(push, encoding)
        assert raw is not None
        return raw

    def post(p: str, body: bytes, token: str | None, **kw) -> bytes:  # every body with `encoding`'s type
        return _post(p, body, token, content_type=CONTENT_TYPES[encoding], **kw)

    p = path
    good = p_body(valid_push())
    # ----- malformed JSON
    for cut in range(1, len(good), max(1, len(good) // 40)):
        yield "malformed_json", post(p, good[:cut], token), True
    for _ in range(40):
        yield "malformed_json", post(p, bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))), token), True
    for junk in (b"", b"null", b"[]", b"0", b'"x"', b"{}", good + b"garbage", b"\xef\xbb\xbf" + good,
                 good.replace(b'"job"', b'"job\xff"'), b"{" * 5000):
        yield "malformed_json", post(p, junk, token), True
    # ----- lying lengths and framing
    for declared in ("0", "1", str(len(good) - 5), str(len(good) + 50), str(10**12), "-1", "abc", "1e3",
                     f"{len(good)}, {len(good)}", " " + str(len(good))):
        yield "lying_length", post(p, good, token, content_length=declared), True
    yield "lying_length", post(p, good, token, headers={"Content-Length": "7"}), True  # two different lengths
    yield "lying_length", post(p, good, token, headers={"Transfer-Encoding": "chunked"}), True
    chunked = (f"POST {p} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: {CONTENT_TYPES[encoding]}\r\n"
               f"Authorization: Bearer {token}\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    for body in (b"ffffffff\r\n" + good, b"zz\r\n" + good + b"\r\n0\r\n\r\n",
                 f"{len(good):x}\r\n".encode() + good + b"\r\n0\r\n\r\n"):
        yield "lying_length", chunked + body, True
    # ----- deep nesting
    for depth in (100, 1_000, 10_000, 100_000):
        yield "deep_nesting", post(p, b"[" * depth + b"]" * depth, token), True
        nested = good[:-1] + b', "extra": ' + b"[" * depth + b"]" * depth + b"}"
        yield "deep_nesting", post(p, nested, token), True
        yield "deep_nesting", post(p, good.replace(b'"job"', b'"job", "x": ' + b'{"a":' * depth + b"1"
                                                   + b"}" * depth + b', "y"', 1), token), True
    # ----- NaN, infinities, huge numbers
    for literal in (b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b"1e-400", b"-0",
                    b"9" * 5000, b"1" + b"0" * 400, b"18446744073709551616", b"0.1e1", b"true", b"null"):
        for key in (b'"duration_s": 1.0', b'"data_wait_s": 0.1', b'"world_size": 1000000', b'"rank": 0',
                    b'"step": 0'):
            name = key.split(b":")[0]
            yield "numbers", post(p, good.replace(key, name + b": " + literal, 1), token), True
    if encoding == "columns":  # the same numbers inside the arrays, and arrays that are not arrays
        for value in (math.nan, math.inf, -math.inf, -1.0, 1e300, -0.0, 5e-324, 2.0**63):
            for field in ("end", "duration_s", "data_wait_s", "comm_wait_s"):
                body = json.loads(good)
                body["columns"][field] = pack("d", [value, 0.5])
                yield "numbers", post(p, json.dumps(body).encode(), token), True
        for value in (-1, -2**63, 2**63 - 1):
            body = json.loads(good)
            body["columns"]["step"] = pack("q", [value, 1])
            yield "numbers", post(p, json.dumps(body).encode(), token), True
        for junk in ("", "====", "AAAA", "not base64", "A" * 100_000, "\u0000", pack("d", [1.0] * 5)):
            body = json.loads(good)
            body["columns"]["duration_s"] = junk
            yield "numbers", post(p, json.dumps(body).encode(), token), True
    # ----- control characters and other unsafe text in every label
    for label in ("job", "node", "group"):
        for char in ("\x00", "\x1b[31m", "\x85", "\u2028", "\u2029", "\u202e", "\u2066", "\ud800", "\n", "\t"):
            body = valid_push()
            body[label] = f"evil{char}name"
            yield "control_chars", post(p, p_body(body), token), True
    yield "control_chars", post(p, good, token, headers={"X-Evil": "a\x85b"}), True
    # ----- headers, methods, auth
    yield "headers", post(p, good, token, headers={"X-Big": "a" * 70_000}), True
    yield "headers", post(p, good, token, headers={f"X-{i}": "v" for i in range(500)}), True
    yield "headers", post(p, good, None), True
    yield "headers", post(p, good, "wrong-token"), True
    yield "headers", post(p, good, "t" * 10_000), True
    yield "headers", post(p, good, token, headers={"Content-Encoding": "gzip"}), True
    yield "headers", b"GET /api/v1/push HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", True
    for raw in (b"BREW /api/v1/push HTTP/1.1\r\nHost: x\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"\x16\x03\x01\x02\x00",
                b"GET /\r\n\r\n", b"GET /api/v1/findings?job=%ff%fe&state=x HTTP/1.1\r\nHost: x\r\n\r\n",
                b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", b"\r\n" * 100):
        yield "headers", raw, True
    # ----- label floods to every cap (a new job / rank / GPU per push; big pushes for the step cap)
    floods = floods or {}
    yield "flood_jobs", post(p, good, token), True  # job "job" exists: the rank and GPU floods grow it
    for i in range(floods.get("jobs", 0)):
        yield "flood_jobs", post(p, p_body(valid_push(job=f"flood-job-{i}", gpu=i % 7)), token), True
    for i in range(floods.get("ranks", 0)):
        yield "flood_ranks", post(p, p_body(valid_push(rank=i, gpu=i % 7)), token), True
    for i in range(floods.get("gpus", 0)):  # ranks of job "job" move to new GPUs, their old ones still used
        body = valid_push(rank=i % movable_ranks, gpu=10_000_000 + i)
        yield "flood_gpus", post(p, p_body(body), token), True
    for i in range(floods.get("steps", 0) // 1000):
        job = i % held_jobs
        yield "flood_steps", post(p, p_body(valid_push(job=f"flood-job-{job}", gpu=job % 7, steps=1000,
                                                       first=i * 1000)), token), True


# A TLS record header announcing a 512-byte ClientHello, and the first bytes of it: the rest never comes.
TLS_PARTIAL_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"


@dataclass
class SlowLoris:
    """Holds `connections` connections open to 127.0.0.1:`port`, each sending a request head one byte every
    `drip_s` that never completes (some send nothing at all); reopens those the server closes. Bounded: stop().

    `head` is what each starts with: half a request head, or against a TLS port the start of a ClientHello
    (TLS_PARTIAL_HELLO), so the handshake itself never completes."""

    port: int
    connections: int
    drip_s: float = 1.0
    head: bytes = b"GET /metrics HTTP/1.1\r\nX-a: "
    opened: int = 0
    closed_by_server: int = 0
    connect_failures: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _socks: list[socket.socket | None] = field(default_factory=list)

    def start(self) -> SlowLoris:
        for i in range(self.connections):
            self._socks.append(self._open(i))
        self._thread = threading.Thread(target=self._run, name="slow-loris", daemon=True)
        self._thread.start()
        return self

    def _open(self, i: int) -> socket.socket | None:
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=2.0)
        except OSError:
            self.connect_failures += 1
            return None
        s.setblocking(False)
        self.opened += 1
        if i % 4:  # three in four start a request line; the rest never send a byte
            try:
                s.send(self.head)
            except OSError:
                pass
        return s

    def _alive(self, s: socket.socket) -> bool:
        try:
            return s.recv(4096, socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False

    def _run(self) -> None:
        while not self._stop.wait(self.drip_s):
            for i, s in enumerate(self._socks):
                if self._stop.is_set():
                    return
                if s is not None and self._alive(s):
                    if i % 4:
                        try:
                            s.send(b"a")
                        except OSError:
                            pass
                    continue
                if s is not None:
                    self.closed_by_server += 1
                    s.close()
                self._socks[i] = self._open(i)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)
        for s in self._socks:
            if s is not None:
                s.close()
        self._socks.clear()
