"""The early-push burst: every rank of one big job pushes at once, against the same pushes on the regular cadence.

When a step stands out for a whole synchronous job (a checkpoint, a collective stall, one slow rank that all
wait for), every rank sees it and pushes early within milliseconds (gpumond/job/early.py): at 32,768 ranks
~32,768 requests at once, each from its own host. This measures what the rules service does then.

- The service: the real `gpumond rules` daemon, 1 shard, the default config (its connection guard with the
  default `max_connections` 4,096, the default per-client push rate, its evaluation loop and detectors; no
  telemetry source), on 127.0.0.1.
- The ranks: not the SDK's `Pusher` itself, whose push thread per rank cannot run 32,768-fold here (threads
  count against the kernel's pid_max, 32,768 on the development VM), but its push path on asyncio (`Rank`): the
  SDK's body encoder (gpumond.job.payload, JSON, its default) and identity head, its backoff schedule
  (gpumond.wire.retry.Backoff with the pusher's base and cap), Retry-After and which answers are retried
  (gpumond.wire.retry), the transport's one immediate retry on a kept-alive connection the server closed, the
  reporter's 2 s timeout (connect, then the answer) and 512 steps a push, and how it counts a 2xx's `dropped`.
  One kept-alive connection per rank across the phases, in CLIENTS processes (the per-process descriptor
  limit). Each node's 8 ranks connect from the node's own loopback address (127.1.x.y; Linux routes all of 127/8
  to lo), so the per-client rate limit and the ephemeral ports are per node, as in a real cluster. The client
  processes run at nice 19: on a cluster every rank has a host of its own, here they share the service's CPUs.
- Every process follows one schedule on CLOCK_MONOTONIC: the regular phases' pushes at each rank's phase, spread
  evenly over the 5 s push interval; the burst's all at one instant.

Phases, one after another: **warm** (every rank's first push: the service learns the ranks; regular cadence),
**regular** (the baseline: every rank pushes the 10 steps of its last 5 s, spread over 5 s; `--passes` times),
a quiet window (5 s: the service's CPU with no pushes),
then **burst** (every rank queues the steps since its last regular push, 1-10 by its phase, and all push at
one instant on CLOCK_MONOTONIC), then **settle** (ranks with steps still queued keep pushing them, no new
steps). Each phase ends when every rank's steps are accepted or after `--phase-timeout` (settle: twice that). Per phase: time from the phase's start until every rank's
steps were accepted, per rank from its due time to its accepted push (p50/p99/max), per request latency,
failed attempts by kind (the SDK retried each), reconnects, the service's CPU and peak RSS. At the end: steps
sent against the steps the service holds (`gpumond_rules_held{kind="steps"}`): records lost, which must be 0,
and the connection guard's counters (evicted, shed).

`--jitter-ms` spreads the burst's pushes uniformly over that many milliseconds (what an SDK jitter on early
pushes would do), for a before/after in one run (`--jitter-ms 0 300`: one service per variant); `--before DIR`
runs the same with the daemon from another checkout first; `--max-connections` sets the service's cap.

    python benchmarks/push_burst.py            # 32,768 ranks (a few minutes on 2 vCPUs; take the lock)
    python benchmarks/push_burst.py --quick    # 512 ranks, seconds (smoke test)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import multiprocessing as mp
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench  # noqa: E402

TOKEN = "push-burst-benchmark-token-0123456789"
INTERVAL_S = 5.0  # the SDK's push_interval_s
STEP_S = 0.5  # two steps a second: a regular push carries 10
RANKS_PER_NODE = 8
JOB = "burst-job"


def node_address(node: int) -> str:
    """Node `node`'s own loopback address (the service tells clients apart by address)."""
    if node >= 1 << 16:
        raise ValueError("at most 65,536 simulated nodes")
    return f"127.1.{node >> 8}.{node & 255}"


def phase_of(rank: int, ranks: int) -> float:
    """The rank's offset within the push interval: spread evenly, neighbours apart."""
    return INTERVAL_S * ((rank * 2654435761) % ranks) / ranks if ranks > 1 else 0.0


def burst_steps(rank: int, ranks: int) -> int:
    """Steps since the rank's last regular push when the standing-out step ends on an interval boundary."""
    return max(1, math.ceil((INTERVAL_S - phase_of(rank, ranks)) / STEP_S - 1e-9))


# ----- a client process: its ranks, each with its own connection --------------------------------------------
class _Closed(ConnectionError):
    """The server closed the connection before answering (http.client's RemoteDisconnected)."""


# What a kept-alive connection the server closed meanwhile raises on reuse: HttpTransport retries once at once.
_STALE = (_Closed, ConnectionResetError, BrokenPipeError)


class Rank:
    """One rank's push path, as the SDK's `Pusher` + `HttpTransport` take it, on asyncio: its queued steps, one
    kept-alive connection from its node's address, the SDK's encoder, backoff and Retry-After handling, and the
    transport's one immediate retry on a stale kept-alive connection. What a 2xx's `dropped` says is counted."""

    def __init__(self, rank: int, world: int, port: int, encoding: str = "json") -> None:
        from gpumond.job.payload import encode_head, encoder
        from gpumond.job.pusher import BACKOFF_BASE_S, BACKOFF_CAP_S
        from gpumond.job.settings import Identity
        from gpumond.wire.media import CONTENT_TYPES
        from gpumond.wire.retry import Backoff

        self.rank, self.port = rank, port
        self.address = node_address(rank // RANKS_PER_NODE)
        self.head = encode_head({**Identity(JOB, rank, world, f"node-{rank // RANKS_PER_NODE:05d}",
                                            f"GPU-{rank:08x}-0000-4000-8000-000000000000", None).head(),
                                 "incarnation": f"{os.getpid():x}-{rank:08x}"}, encoding)
        self.encode = encoder(encoding)  # the SDK's GPUMOND_PUSH_ENCODING: json (its default) or columns
        self.request = REQUEST.replace(b"%CT", CONTENT_TYPES[encoding].encode())
        self.backoff = Backoff(BACKOFF_BASE_S, BACKOFF_CAP_S)
        self.queue: list[tuple] = []
        self.next_step = 0
        self.sent = self.pushed = self.dropped = 0
        self.service_dropped: collections.Counter = collections.Counter()
        self.connections = 0
        self.log: list[tuple[float, float, object, int]] = []  # (start, end, status or exception, reconnects)
        self._reader = self._writer = None

    def queue_steps(self, n: int, now: float) -> None:
        for k in range(n):  # (step, end, duration, data wait, samples): what the training thread queues
            self.queue.append((self.next_step, now - (n - 1 - k) * STEP_S, STEP_S, 0.01, 32))
            self.next_step += 1
        self.sent += n

    async def push(self) -> float:
        """Push what is queued, retrying as the SDK's push thread does, until the service took it: when it did."""
        from gpumond.wire.retry import parse_retry_after, retryable

        while True:
            batch = self.queue[:SDK_MAX_STEPS]
            body = self.encode(self.head, batch, time.time(), time.monotonic())
            t0, opened = time.monotonic(), self.connections
            try:
                status, retry_after, text = await self._post(body)
            except (OSError, TimeoutError) as exc:  # no answer: refused, reset, timed out
                self.log.append((t0, time.monotonic(), type(exc).__name__, self.connections - opened))
                await asyncio.sleep(self.backoff.after_failure(None))
                continue
            done = time.monotonic()
            self.log.append((t0, done, status, self.connections - opened))
            if 200 <= status < 300:
                self._pushed(batch, text)
                if not self.queue:
                    return done
            elif retryable(status):
                await asyncio.sleep(self.backoff.after_failure(parse_retry_after(retry_after, time.time())))
            else:  # refused for good: the SDK drops the batch
                del self.queue[:len(batch)]
                self.dropped += len(batch)
                self.backoff.reset()
                if not self.queue:
                    return done

    def _pushed(self, batch: list[tuple], text: bytes) -> None:
        try:
            dropped = json.loads(text).get("dropped") or {}
        except (ValueError, AttributeError):
            dropped = {}
        lost = 0
        for reason, n in dropped.items():
            if reason == "duplicate" and self.backoff.failures:
                continue  # a retry of a batch the service stored when its answer was lost (as the SDK counts it)
            lost += n
            self.service_dropped[reason] += n
        del self.queue[:len(batch)]
        self.pushed += len(batch) - lost
        self.dropped += lost
        self.backoff.reset()

    async def _post(self, body: bytes) -> tuple[int, str | None, bytes]:
        reused = self._writer is not None
        try:
            return await self._exchange(body)
        except _STALE:
            self.close()
            if not reused:
                raise
        return await self._exchange(body)

    async def _exchange(self, body: bytes) -> tuple[int, str | None, bytes]:
        try:
            if self._writer is None:  # http.client's timeout: each of connect and the answer within timeout_s
                self._reader, self._writer = await asyncio.wait_for(asyncio.open_connection(
                    "127.0.0.1", self.port, local_addr=(self.address, 0)), SDK_TIMEOUT_S)
                self.connections += 1
            self._writer.write(self.request % (self.port, len(body)) + body)
            return await asyncio.wait_for(self._answer(), SDK_TIMEOUT_S)
        except BaseException:
            self.close()  # half a request leaves the connection in an unknown state
            raise

    async def _answer(self) -> tuple[int, str | None, bytes]:
        try:
            head = await self._reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as e:
            raise _Closed("the server closed the connection without an answer") from e
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        text = await self._reader.readexactly(int(fields.get("content-length", "0")))
        if fields.get("connection", "").lower() == "close":
            self.close()
        return status, fields.get("retry-after"), text

    def close(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()  # as http.client's close: the socket's, no graceful wait


REQUEST = (f"POST /api/v1/push HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Bearer {TOKEN}\r\n"
           f"Content-Type: %CT\r\nUser-Agent: gpumond-job-burst-bench\r\nContent-Length: %d\r\n"
           f"\r\n").encode()
SDK_MAX_STEPS = 512  # the reporter's max_steps_per_push
SDK_TIMEOUT_S = 2.0  # the reporter's timeout_s


def _client(port: int, ranks: list[int], world: int, encoding: str, orders: mp.Queue, results: mp.Queue) -> None:
    # The service gets its core first: on a cluster every rank has a host of its own, here the ranks share the
    # service's two CPUs, and their CPU would otherwise be taken from it (niced, they use what it leaves).
    os.nice(19)
    asyncio.run(_client_loop(port, ranks, world, encoding, orders, results))


async def _client_loop(port: int, ranks: list[int], world: int, encoding: str, orders: mp.Queue,
                       results: mp.Queue) -> None:
    loop = asyncio.get_running_loop()  # its clock is time.monotonic: one schedule across the processes
    states = [Rank(r, world, port, encoding) for r in ranks]
    results.put(("ready", len(ranks)))
    while (order := await loop.run_in_executor(None, orders.get)) is not None:
        kind, start, jitter_s, spread_s, timeout_s = order
        now = time.monotonic()
        marks = [len(s.log) for s in states]
        tasks, dues = [], []
        for s in states:
            if kind == "settle":  # no new steps: what is still queued is pushed (retried) until taken
                if s.queue:
                    dues.append(start)
                    tasks.append(asyncio.create_task(_at(start, s.push())))
                continue
            s.queue_steps(burst_steps(s.rank, world) if kind == "burst" else round(INTERVAL_S / STEP_S), now)
            offset = ((jitter_s * ((s.rank * 40503) % 65536) / 65536) if kind == "burst"
                      else phase_of(s.rank, world) * spread_s / INTERVAL_S)
            dues.append(start + offset)
            tasks.append(asyncio.create_task(_at(start + offset, s.push())))
        if tasks:
            await asyncio.wait(tasks, timeout=max(0.0, start + timeout_s - time.monotonic()))
        accept, accepted_at, unaccepted, stopped = [], [], 0, []
        for task, due in zip(tasks, dues):
            if task.done() and not task.cancelled() and task.exception() is None:
                accept.append(task.result() - due)
                accepted_at.append(task.result() - start)
            else:
                task.cancel()
                stopped.append(task)
                unaccepted += 1
        # cancel() only asks: a rank's unfinished push must have closed its connection before the next phase
        # pushes on that rank again, or two pushes would read one connection at once
        await asyncio.gather(*stopped, return_exceptions=True)
        results.put(("phase", {
            "accept": accept, "accepted_at": accepted_at, "unaccepted": unaccepted,
            "requests": [(e[1] - e[0], e[2], e[3]) for s, m in zip(states, marks) for e in s.log[m:]],
            "sent": sum(s.sent for s in states), "pushed": sum(s.pushed for s in states),
            "dropped": sum(s.dropped for s in states),
            "service_dropped": dict(sum((s.service_dropped for s in states), collections.Counter())),
        }))
    for s in states:
        s.close()


async def _at(when: float, work):
    await asyncio.sleep(max(0.0, when - time.monotonic()))
    return await work


class Clients:
    """CLIENTS processes holding the ranks; forked before the harness starts any thread."""

    def __init__(self, port: int, ranks: int, procs: int, encoding: str = "json") -> None:
        ctx = mp.get_context("fork")
        self.results = ctx.Queue()
        self.orders = [ctx.Queue() for _ in range(procs)]
        self.procs = [ctx.Process(target=_client, args=(port, list(range(i, ranks, procs)), ranks, encoding, q,
                                                                 self.results),
                                  daemon=True) for i, q in enumerate(self.orders)]
        for p in self.procs:
            p.start()
        self._collect("ready", 600)

    def _collect(self, kind: str, timeout_s: float) -> list:
        out = []
        for _ in self.procs:
            got_kind, value = self.results.get(timeout=timeout_s)
            if got_kind != kind:
                raise RuntimeError(f"client said {got_kind!r}, expected {kind!r}")
            out.append(value)
        return out

    def phase(self, kind: str, start: float, jitter_s: float, timeout_s: float, spread_s: float = INTERVAL_S) -> dict:
        for q in self.orders:
            q.put((kind, start, jitter_s, spread_s, timeout_s))
        parts = self._collect("phase", timeout_s + 120)
        merged: dict = {"service_dropped": collections.Counter()}
        for part in parts:
            for key, value in part.items():
                if isinstance(value, list):
                    merged.setdefault(key, []).extend(value)
                elif isinstance(value, dict):
                    merged["service_dropped"].update(value)
                else:
                    merged[key] = merged.get(key, 0) + value
        return merged

    def close(self) -> None:
        _bench.stop_workers(self.orders, self.procs)


# ----- the service -------------------------------------------------------------------------------------------
class Service:
    """The `gpumond rules` daemon with the default config, a sampler of its RSS, and its /metrics."""

    def __init__(self, workdir: Path, max_connections: int | None, tree: Path | None = None,
                 log_level: str = "error") -> None:
        self.port = _bench.free_port()
        config = workdir / "rules.yaml"
        config.write_text(f"tokens: [{TOKEN}]\nstate_dir: {workdir / 'state'}\n"
                          + ("" if max_connections is None else f"http: {{max_connections: {max_connections}}}\n"))
        exe = shutil.which("gpumond")
        argv = [exe] if exe and tree is None else [sys.executable, "-m", "gpumond.cli"]
        # `tree`: the daemon from another checkout's gpumond/ (a before/after in one run), imported first
        self.proc = _bench.Proc("rules", [*argv, "rules", "--config", str(config), "--listen",
                                          f"127.0.0.1:{self.port}", "--log-level", log_level], workdir / "rules.log",
                                env={"PYTHONPATH": str(tree)} if tree else None, cwd=tree or _bench.REPO)
        self.proc.start()
        self.proc.wait_http(f"{self.url}/healthz", 60)
        self.rss_peak_kib = 0
        self._stop = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sample(self) -> None:
        """Sample RSS every 50 ms until stop(): the peak of each phase (reset with reset_peak)."""
        def run() -> None:
            while not self._stop.wait(0.05):
                try:
                    self.rss_peak_kib = max(self.rss_peak_kib, _bench.proc_status_kib(self.proc.pid, "VmRSS"))
                except (OSError, KeyError):
                    return
        threading.Thread(target=run, name="rss", daemon=True).start()

    def rss_kib(self) -> int:
        return _bench.proc_status_kib(self.proc.pid, "VmRSS")

    def cpu_s(self) -> float:
        return _bench.proc_cpu_s(self.proc.pid)

    def metrics(self) -> dict[str, float]:
        text = _bench.fetch(self.url + "/metrics", timeout_s=60).decode()
        out = {}
        for name, labels, value in re.findall(r"^(gpumond_(?:rules_held|rules_push_steps_total|rules_pushes_total|"
                                              r"http_connections_\w+))(?:\{([^}]*)\})? (\S+)$", text, re.M):
            out[f"{name}{{{labels}}}" if labels else name] = float(value)
        return out

    def stop(self) -> None:
        self._stop.set()
        self.proc.terminate(30)


class Spy:
    """py-spy sampling one process's Python stacks (the thread holding the GIL) until stop().
    Non-blocking: the service is never paused, and py-spy's own CPU is its own process's."""

    def __init__(self, pid: int, out: Path, rate: int = 1000) -> None:
        exe = shutil.which("py-spy")
        if exe is None:
            raise SystemExit("--profile needs py-spy (pip install py-spy)")
        self.out = out
        # --gil: only a thread holding the GIL is sampled, so a thread waiting in epoll (or any system call
        # that releases the GIL) is not counted as busy: this profiles the Python side, user CPU; the kernel's
        # share is the per-regime table's.
        self.proc = subprocess.Popen([exe, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw",
                                      "--nonblocking", "--gil", "--function", "--output", str(out)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> collections.Counter:
        """Stop sampling; the collapsed stacks (outermost frame first) and their sample counts."""
        self.proc.send_signal(signal.SIGINT)  # py-spy writes what it has on SIGINT
        self.proc.wait(60)
        stacks: collections.Counter = collections.Counter()
        for line in self.out.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if stack:
                stacks[tuple(stack.split(";"))] += int(n)
        return stacks


QUIET_S = 5.0  # one evaluation cycle at the default 5 s interval


def _quiet_cpu(service: "Service", seconds: float) -> float:
    """The service's CPU per second of wall time while no rank pushes (its evaluation loop, its timers)."""
    cpu0, t0 = service.cpu_s(), time.monotonic()
    time.sleep(seconds)
    return (service.cpu_s() - cpu0) / (time.monotonic() - t0)


# ----- the run -----------------------------------------------------------------------------------------------
def run_variant(label: str, ranks: int, procs: int, jitter_s: float, phase_timeout_s: float, workdir: Path,
                max_connections: int | None, tree: Path | None, encoding: str = "json",
                profile: str | None = None, passes: int = 1, spread_s: float = INTERVAL_S,
                log_level: str = "error") -> dict:
    """One service, CLIENTS processes, the three phases; every figure the report needs. `profile`: the phase
    during which py-spy samples the service (its Python stacks, on CPU only). `passes`: how many times the
    regular phase runs (the per-regime table sums them); a quiet window after them measures the service's CPU
    with no pushes (its evaluation loop), which that table subtracts."""
    service = Service(workdir, max_connections, tree, log_level)
    clients = None
    stacks: collections.Counter = collections.Counter()
    try:
        rss_idle_kib = service.rss_kib()
        t0 = time.monotonic()
        clients = Clients(service.port, ranks, procs, encoding)
        setup_s = time.monotonic() - t0
        service.sample()
        phases, pushed, extra = {}, 0, []
        for kind in ("warm", *["regular"] * passes, "burst", "settle"):
            if kind == "burst":  # a quiet window: the burst meets an idle service, not the regular pass's tail
                quiet = _quiet_cpu(service, QUIET_S)
            start = time.monotonic() + 0.5
            service.rss_peak_kib = service.rss_kib()
            split0 = _bench.proc_cpu_split(service.proc.pid)
            cpu0, wall0 = service.cpu_s(), time.monotonic()
            spy = Spy(service.proc.pid, workdir / f"{kind}-{len(extra) + (kind in phases)}.stacks") if kind == profile else None
            got = clients.phase(kind, start, jitter_s if kind == "burst" else 0.0,
                                phase_timeout_s * (2 if kind == "settle" else 1), spread_s)
            wall = max(got["accepted_at"], default=math.nan)
            cpu, span = service.cpu_s() - cpu0, time.monotonic() - wall0
            sys_s = _bench.proc_cpu_split(service.proc.pid)[1] - split0[1]
            if spy is not None:
                stacks += spy.stop()  # every regular pass's, with --passes
            got.update(cpu_s=cpu, wall_s=wall, rss_peak_kib=service.rss_peak_kib, rss_end_kib=service.rss_kib(),
                       sys_s=sys_s,
                       span_s=span, metrics=service.metrics(), load1=os.getloadavg()[0])
            got["pushed_in_phase"], pushed = got["pushed"] - pushed, got["pushed"]
            if kind in phases:  # a further regular pass: kept apart, the per-phase tables show the first
                extra.append(got)
            else:
                phases[kind] = got
            print(f"[{ranks:,} ranks, {label}] {kind}: every rank accepted after {wall:.2f} s, "
                  f"unaccepted {got['unaccepted']}, service CPU {cpu:.1f} s", file=sys.stderr, flush=True)
        end = service.metrics()
        return {"label": label, "ranks": ranks, "procs": procs, "jitter_s": jitter_s, "setup_s": setup_s,
                "phases": phases, "encoding": encoding, "max_connections": max_connections, "spread_s": spread_s,
                "log_level": log_level,
                "rss_idle_kib": rss_idle_kib, "stacks": stacks, "regular_passes": [phases["regular"], *extra],
                "quiet_cpu_per_s": quiet,
                "end": end, "rss_end_kib": service.rss_kib()}
    finally:
        if clients is not None:
            clients.close()
        service.stop()


def _q(xs: list[float], q: float) -> float:
    return _bench.quantile(xs, q) if xs else math.nan


def _ms(seconds: float) -> str:
    return "—" if math.isnan(seconds) else f"{seconds * 1e3:,.0f} ms"


FAILURE_NAMES = {"ConnectionResetError": "reset", "_Closed": "closed before an answer",
                 "BrokenPipeError": "broken pipe",
                 "TimeoutError": "timeout", "ConnectionRefusedError": "refused"}


def _failures(requests: list[tuple[float, object, int]]) -> str:
    counts = collections.Counter(
        (f"HTTP {outcome}" if isinstance(outcome, int) else FAILURE_NAMES.get(outcome, outcome))
        for _, outcome, _ in requests if outcome != 202)
    return ", ".join(f"{k} {v:,}" for k, v in counts.most_common()) or "none"


def _closed(metrics: dict[str, float], reason: str) -> int:
    return int(metrics.get(f'gpumond_http_connections_closed_total{{reason="{reason}"}}', 0))


def _accepted(p: dict) -> int:
    return sum(1 for _, outcome, _ in p["requests"] if outcome == 202)


def regimes(variants: list[dict], phase: str = "regular") -> str:
    """The service's CPU per accepted push in `phase` by variant (connection cap x encoding), and the memory of
    a held connection from two variants that differ only in how many connections they held."""
    rows, by, levels = [], {}, {}
    for v in variants:
        passes = v["regular_passes"]
        p = passes[-1]
        pushes = sum(_accepted(q) for q in passes)
        steps = sum(q["pushed_in_phase"] for q in passes)
        cpu, sys_s = sum(q["cpu_s"] for q in passes), sum(q["sys_s"] for q in passes)
        quiet = v["quiet_cpu_per_s"] * sum(q["span_s"] for q in passes)  # what the same time costs idle
        held = int(p["metrics"].get("gpumond_http_connections_open", 0))
        reconnects = sum(c for q in passes for _, _, c in q["requests"])
        per_push = (cpu - quiet) / max(1, pushes)
        by[(v["encoding"], v["max_connections"], v["spread_s"])] = (per_push, held, p["rss_end_kib"])
        levels.setdefault((v["encoding"], v["max_connections"], v["spread_s"]), {})[v["log_level"]] = per_push
        rows.append([v["label"], f"{len(passes)}", f"{pushes:,}", f"{steps / max(1, pushes):.1f}", f"{reconnects:,}",
                     f"{held:,}", f"{cpu:.2f} s", f"{quiet:.2f} s", f"**{per_push * 1e3:.3f} ms**",
                     f"{(cpu - sys_s - quiet) / max(1, pushes) * 1e3:.3f} ms", f"{sys_s / max(1, pushes) * 1e3:.3f} ms",
                     f"{(cpu - quiet) / max(1, steps) * 1e6:.0f} µs", f"{p['rss_end_kib'] / 1024:,.1f} MiB"])
    text = _bench.md_table(["variant", "passes", "pushes accepted", "steps a push", "reconnects",
                            "connections held at the end", "service CPU", "of which idle (quiet window's rate)",
                            "**CPU per push** (less idle)", "of which user (less idle)", "of which kernel",
                            "CPU per step", "service RSS at the end"], rows)
    notes = []
    caps = sorted({c for _, c, _ in by if c is not None})
    spreads = sorted({sp for _, _, sp in by}, reverse=True)
    for sp in spreads:
        at = f" (over {sp:g} s)" if len(spreads) > 1 else ""
        for enc in sorted({e for e, _, _ in by}):
            if len(caps) >= 2 and (enc, caps[0], sp) in by and (enc, caps[-1], sp) in by:
                low, high = by[(enc, caps[0], sp)], by[(enc, caps[-1], sp)]
                notes.append(f"{enc}{at}: reconnecting (cap {caps[0]:,}) ÷ kept alive (cap {caps[-1]:,}) = "
                             f"**{low[0] / high[0]:.2f}×** CPU per push ({(low[0] - high[0]) * 1e3:+.3f} ms)")
                if high[1] != low[1]:
                    per_conn = (high[2] - low[2]) * 1024 / (high[1] - low[1])
                    notes.append(f"{enc}{at}: RSS per held connection ≈ ({high[2]:,} − {low[2]:,} KiB) ÷ "
                                 f"({high[1]:,} − {low[1]:,} connections) = **{per_conn:,.0f} bytes** (same steps "
                                 f"held by both)")
        for cap in caps:
            if ("json", cap, sp) in by and ("columns", cap, sp) in by:
                notes.append(f"cap {cap:,}{at}: columns ÷ JSON = "
                             f"**{by[('columns', cap, sp)][0] / by[('json', cap, sp)][0]:.2f}×** CPU per push")
    for (enc, cap, sp), per_level in levels.items():
        if "info" in per_level and "error" in per_level:
            notes.append(f"{enc}, cap {cap}, over {sp:g} s: the daemon at log level info ÷ error = "
                         f"**{per_level['info'] / per_level['error']:.2f}×** CPU per push "
                         f"({(per_level['info'] - per_level['error']) * 1e3:+.3f} ms)")
    for enc, cap in sorted({(e, c) for e, c, _ in by if c is not None}):
        if len(spreads) >= 2 and (enc, cap, spreads[0]) in by and (enc, cap, spreads[-1]) in by:
            fast, slow = by[(enc, cap, spreads[-1])][0], by[(enc, cap, spreads[0])][0]
            notes.append(f"{enc}, cap {cap:,}: pushes {spreads[0] / spreads[-1]:g}× as fast (over {spreads[-1]:g} s) "
                         f"÷ over {spreads[0]:g} s = **{fast / slow:.2f}×** CPU per push")
    return (f"## CPU per push by regime ({phase} phase)\n\n" + text + "\n\n" + "".join(f"- {n}\n" for n in notes) +
            f"\nThe {phase} phase: every rank pushes its 10 steps once, spread over 5 s. With a cap below the ranks "
            "the guard closes the longest-idle kept-alive connection for each new one, so every push meets a closed "
            "connection and reconnects (the SDK's transport retries at once on a fresh one); with a cap above "
            "them the warm phase's connections are reused. CPU per push: the service's process CPU over the phase "
            "less what the same time cost it with no pushes (its evaluation loop, measured over a quiet "
            f"{QUIET_S:g} s window after the regular passes), ÷ pushes accepted; user: the process's own code "
            "(Python, the parser, numpy); kernel: system calls on its behalf (accept, recv, send, close, epoll) and "
            "what the kernel charges it meanwhile (on loopback, the TCP processing of the packets it sends). "
            "The clocks tick at 100 Hz: a figure is ± 0.01 s ÷ pushes.")


# Functions whose inclusive share of the profile is shown: where a push's CPU could go besides the handler.
_WATCH = (("_accept_connection", "accept(): the listening socket's backlog"),
          ("_accept_connection2", "a new connection: transport, protocol, connection_made"),
          ("tcp_opened", "the guard taking a connection (cap, eviction)"),
          ("_close", "the guard closing a connection (eviction)"),
          ("data_received", "bytes in: parse, then the guard's state"),
          ("run_asgi", "the ASGI request (app, handler, response)"),
          ("connection_lost", "a connection's end (protocol + guard)"),
          ("_call_connection_lost", "asyncio's close of a transport"),
          ("_read_ready__data_received", "socket recv + data_received"),
          ("_write_ready", "socket send of a buffered response"),
          ("write", "sending a response"),
          ("warning", "log records (the guard's eviction warnings)"),
          ("_run_once", "the event loop (everything on it)"))


def _frame(frame: str) -> tuple[str, str]:
    """(function, file) of a py-spy frame "function (path:line)"."""
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0]
    for marker in ("site-packages/", "lib/python3", "gpumond/"):
        if marker in path:
            path = path[path.index(marker) + len(marker):] if marker != "gpumond/" else path[path.index(marker):]
            break
    return name, path


def profile_section(v: dict, phase: str, top: int = 20) -> str:
    """Where the service's CPU went in one variant's `phase`, from py-spy's samples, per accepted push."""
    stacks = v["stacks"]
    total = sum(stacks.values())
    if not total:
        return f"## Profile: {v['label']}, {phase} phase\n\nNo samples (py-spy could not attach?)."
    sampled = v["regular_passes"] if phase == "regular" else [v["phases"][phase]]
    user_s = sum(p["cpu_s"] - p["sys_s"] for p in sampled)  # the GIL holder's CPU is user CPU
    per_push_us = user_s / max(1, sum(_accepted(p) for p in sampled)) * 1e6
    own: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    callers: dict = collections.defaultdict(collections.Counter)
    for stack, n in stacks.items():
        frames = [_frame(f) for f in stack]
        own[frames[-1]] += n
        if len(frames) > 1:
            callers[frames[-1]][frames[-2]] += n
        for f in set(frames):
            inclusive[f] += n
    def row(key, n):
        return [f"`{key[0]}`", f"`{key[1]}`", f"{n / total * 100:.1f} %", f"{n / total * per_push_us:.0f} µs"]
    def caller(key) -> str:
        (name, path), n = callers[key].most_common(1)[0] if callers[key] else ((None, None), 0)
        return "—" if name is None else f"`{name}` ({path}, {n / own[key] * 100:.0f} %)"
    own_rows = [[*row(k, n), caller(k)] for k, n in own.most_common(top)]
    watch_rows = []
    for name, what in _WATCH:
        for key, n in sorted(inclusive.items(), key=lambda kv: -kv[1]):
            if key[0].rpartition(".")[2] == name:
                watch_rows.append([*row(key, n), what])
    return (f"## Profile: {v['label']}, {phase} phase\n\n"
            f"py-spy, {total:,} samples of the service's thread holding the GIL; each share × the phase's "
            f"{per_push_us:,.0f} µs of the service's *user* CPU per accepted push (the kernel's: the table "
            f"above).\n\n**Inclusive** (the function and what it "
            f"calls):\n\n" + _bench.md_table(["function", "file", "share", "per push", "what"], watch_rows) +
            "\n\n**Own time** (top functions; C code called from a Python function counts as that function's):\n\n"
            + _bench.md_table(["function", "file", "share", "per push", "mostly called from"], own_rows))


def report(variants: list[dict], args: argparse.Namespace) -> list[str]:
    sections = []
    axes = ("encoding", "max_connections", "spread_s", "log_level")
    if any(v[k] != variants[0][k] for v in variants for k in axes) or args.passes > 1:
        sections.append(regimes(variants))
    for v in variants:
        if v["stacks"]:
            sections.append(profile_section(v, args.profile))
    rows, loss_rows, conn_rows = [], [], []
    for v in variants:
        tag = v["label"] if len(variants) > 1 else ""
        prev_closed = {"evicted": 0, "shed": 0, "head_timeout": 0}
        for kind in ("warm", "regular", "burst", "settle"):
            p = v["phases"][kind]
            req = p["requests"]
            lat = [d for d, outcome, _ in req if outcome == 202]
            failed = sum(1 for _, outcome, _ in req if outcome != 202)
            reconnects = sum(c for _, _, c in req)
            label = f"{tag}: {kind}" if tag else kind
            wall = "—" if math.isnan(p["wall_s"]) else f"{p['wall_s']:.2f} s"
            share = "" if math.isnan(p["wall_s"]) else f" ({p['cpu_s'] / max(p['wall_s'], 1e-9) * 100:.0f} %)"
            ranks_pushing = len(p["accept"]) + p["unaccepted"]
            rows.append([label, f"{len(req) - failed:,} of {ranks_pushing:,} ranks", wall, _ms(_q(p["accept"], 0.5)),
                         _ms(_q(p["accept"], 0.99)), _ms(max(p["accept"], default=math.nan)),
                         _ms(_q(lat, 0.5)), _ms(_q(lat, 0.99)), f"{failed:,} ({_failures(req)})",
                         f"{reconnects:,}", f"{p['cpu_s']:.1f} s{share}",
                         f"{p['rss_peak_kib'] / 1024:,.0f} MiB", f"{p['load1']:.1f}"])
            m = p["metrics"]
            closed = {k: _closed(m, k) for k in prev_closed}
            conn_rows.append([label, *(f"{closed[k] - prev_closed[k]:,}" for k in ("evicted", "shed", "head_timeout")),
                              f"{int(m.get('gpumond_http_connections_peak', 0)):,}",
                              f"{int(m.get('gpumond_http_connections_limit', 0)):,}"])
            prev_closed = closed
        end = v["end"]
        held = int(end.get('gpumond_rules_held{kind="steps"}', 0))
        last = v["phases"]["settle"]
        sent, pushed, dropped = last["sent"], last["pushed"], last["dropped"]
        queued = sent - pushed - dropped  # still retrying when the settle phase's time ran out
        # A step is lost when the service does not hold it and no rank still has it queued. A queued step may be
        # held already (stored, but its answer timed out): with steps queued, sent − held is only a bound.
        lost = sent - held
        loss = f"**{lost:,}**" if not queued or lost > queued else f"≤ {lost:,} (undecided: {queued:,} still queued)"
        loss_rows.append([v["label"], f"{sent:,}", f"{pushed:,}", f"{dropped:,}",
                          ", ".join(f"{k} {n:,}" for k, n in last["service_dropped"].items()) or "0",
                          f"{held:,}", f"{queued:,}", loss])
    sections.append("## Per phase\n\n" + _bench.md_table(
        ["phase", "pushes accepted (ranks pushing)", "until every rank's steps accepted", "per rank p50",
         "per rank p99",
         "per rank max", "per request p50 (2xx)", "per request p99 (2xx)", "failed attempts (retried by the SDK)",
         "reconnects", "service CPU (of a core)", "service peak RSS", "load (1 min)"], rows) +
        "\n\n*Per rank*: from the rank's due time (its phase in the interval; the burst's instant) to the end of its "
        "accepted push, retries included. *Per request*: one attempt (connect included when the "
        "connection is new or its kept-alive one was closed). *Until every rank's steps accepted*: from the "
        "phase's start (the regular phases spread their pushes over the first 5 s of it).")
    ratios = []
    for v in variants:
        base, burst = v["phases"]["regular"], v["phases"]["burst"]

        def per_push(p: dict) -> float:
            return p["cpu_s"] / max(1, sum(1 for _, outcome, _ in p["requests"] if outcome == 202))

        def ratio(q: float) -> str:
            r = _q(burst["accept"], q) / _q(base["accept"], q)
            return "—" if math.isnan(r) else f"{r:,.1f}×"

        ratios.append([v["label"], *(ratio(q) for q in (0.5, 0.99, 1.0)),
                       f"{per_push(base) * 1e3:.2f} → {per_push(burst) * 1e3:.2f} ms "
                       f"({per_push(burst) / per_push(base):.2f}×)"
                       if base["accept"] and burst["accept"] else "—"])
    sections.append("## Burst ÷ regular cadence\n\n" + _bench.md_table(
        ["variant", "per-rank p50", "per-rank p99", "per-rank max", "service CPU per accepted push"], ratios) +
        "\n\nThe same ranks, the same service, one after the other: the regular cadence's pushes spread over 5 s, the "
        "burst's at one instant. The burst's pushes carry fewer steps (1-10 by phase, against 10).")
    sections.append("## Records\n\n" + _bench.md_table(
        ["variant", "steps sent (all phases)", "pushed (SDK)", "dropped (SDK)", "not stored (service's reasons)",
         "held by the service at the end", "still queued at the ranks", "**lost** (sent − held)"], loss_rows) +
        "\n\nA phase that runs out of time (`--phase-timeout`) leaves the ranks it did not finish with their steps "
        "queued; the next phase pushes them with its own (the per-phase table's *pushes accepted* falls short). "
        "*settle*: after the burst, the ranks with steps still queued keep pushing them (no new steps) for up to "
        "twice the phase timeout; then the steps the service holds are counted.")
    sections.append("## The connection guard\n\n" + _bench.md_table(
        ["phase", "connections evicted", "shed", "head timeouts", "peak held (cumulative)", "cap"], conn_rows) +
        "\n\nEvicted: the guard closed an idle kept-alive connection (or one without a complete request head) to make "
        "room for a new one past the cap; the SDK meets the closed connection at its next push and reconnects at "
        "once (`reconnects`). Shed: a new connection closed at once because every held one was busy (or, since the "
        "guard spares just-opened connections, opened less than a second ago); its client retries after its backoff. "
        "Head timeouts: connections whose request head the service had not read within 10 s.")
    return sections


def main(argv: list[str] | None = None) -> int:
    ap = _bench.parser(__doc__, "512 ranks")
    ap.add_argument("--ranks", type=int, help="ranks of the one job (default 32,768; quick 512)")
    ap.add_argument("--clients", type=int, help="client processes holding the ranks (default 4; quick 2)")
    ap.add_argument("--jitter-ms", type=float, nargs="+", default=[0.0],
                    help="spread the burst over this many ms (one service per value; default 0: all at once)")
    ap.add_argument("--max-connections", type=int, nargs="+", default=[None],
                    help="the service's http.max_connections (default: the config's default, 4,096); several: one "
                         "service each, and a table of the CPU per push by regime")
    ap.add_argument("--encoding", nargs="+", choices=("json", "columns"), default=["json"],
                    help="the ranks' push encoding (the SDK's GPUMOND_PUSH_ENCODING; default json, the SDK's "
                         "default); several: one service each")
    ap.add_argument("--spread-s", type=float, nargs="+", default=[INTERVAL_S],
                    help="spread the warm and regular phases' pushes over this many seconds (default 5, the push "
                         "interval; less: the same pushes arrive faster); several: one service each")
    ap.add_argument("--log-level", nargs="+", default=["error"],
                    help="the daemon's --log-level (default error: quiet; the daemon's own default is info, at "
                         "which each connection the guard closes makes a rate-limited warning record); several: one "
                         "service each")
    ap.add_argument("--keep-stacks", type=Path, metavar="DIR",
                    help="with --profile: copy py-spy's collapsed stacks (one file per variant and pass) into DIR")
    ap.add_argument("--passes", type=int, default=1,
                    help="run the regular phase this many times (default 1): more pushes for the per-regime table")
    ap.add_argument("--profile", choices=("warm", "regular", "burst"),
                    help="sample the service with py-spy during this phase (every variant) and report its hot "
                         "functions; py-spy's own CPU competes with the service's, so take figures from a run "
                         "without it")
    ap.add_argument("--before", type=Path, metavar="DIR",
                    help="also run the service from DIR/gpumond first (e.g. `git archive REV gpumond | tar -x -C "
                         "DIR`): a before/after of a change in one run")
    ap.add_argument("--name", default="push_burst", help="result file name (default push_burst)")
    ap.add_argument("--before-label", default="before", help="what --before's tree is, for the report")
    ap.add_argument("--phase-timeout", type=float, default=120.0, help="seconds a phase may take (default 120)")
    args = ap.parse_args(argv)
    ranks = args.ranks or (512 if args.quick else 32_768)
    procs = args.clients or (2 if args.quick else 4)
    per_proc = math.ceil(ranks / procs)
    import resource

    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if per_proc + 256 > nofile:
        raise SystemExit(f"{per_proc:,} connections per client process exceed the descriptor limit {nofile:,}: "
                         f"use --clients {math.ceil(ranks / max(1, nofile - 256))} or more")
    def label(name: str, cap: int | None, encoding: str, jitter_ms: float, spread_s: float, level: str) -> str:
        parts = [name]
        if len(args.log_level) > 1:
            parts.append(f"log level {level}")
        if len(args.spread_s) > 1:
            parts.append(f"over {spread_s:g} s")
        if len(args.max_connections) > 1:
            parts.append(f"cap {cap:,}" if cap is not None else "default cap")
        if len(args.encoding) > 1:
            parts.append(encoding)
        parts.append("burst at once" if not jitter_ms else f"burst over {jitter_ms:g} ms")
        return ", ".join(parts)

    plan = [(label(name, cap, encoding, jitter_ms, spread_s, level), tree, cap, encoding, jitter_ms, spread_s, level)
            for name, tree in ([(args.before_label, args.before)] if args.before else []) + [("this tree", None)]
            for level in args.log_level for spread_s in args.spread_s for cap in args.max_connections
            for encoding in args.encoding for jitter_ms in args.jitter_ms]
    variants = []
    with tempfile.TemporaryDirectory(prefix="gpumond-bench-burst-") as tmp:
        for i, (name, tree, cap, encoding, jitter_ms, spread_s, level) in enumerate(plan):
            work = Path(tmp) / f"v{i}"
            work.mkdir()
            variants.append(run_variant(name, ranks, procs, jitter_ms / 1e3, args.phase_timeout, work,
                                        cap, tree, encoding, args.profile, args.passes, spread_s,
                                        level))
            if args.keep_stacks and args.profile:
                (args.keep_stacks / f"v{i}").mkdir(parents=True, exist_ok=True)
                for f in work.glob("*.stacks"):
                    shutil.copy(f, args.keep_stacks / f"v{i}" / f.name)
    facts = {"setup": f"one job of {ranks:,} ranks, {RANKS_PER_NODE} per node (each node its own loopback "
                      f"address), {procs} client processes of the SDK's push path on asyncio (a connection per rank), "
                      f"{' / '.join(e if e == 'columns' else 'JSON' for e in args.encoding)} pushes, {STEP_S:g} s "
                      f"steps; the `gpumond rules` daemon, default config"
                      + ("" if args.max_connections == [None] else
                         f" but http.max_connections {' / '.join(f'{c:,}' for c in args.max_connections if c)}"),
             "note": "clients and service share the machine's CPUs (and it was shared with other work): the client "
                     "side's own CPU is inside every latency; ratios within the run are the comparable figures"}
    _bench.report(args.name, "# The early-push burst: every rank of a job pushing at once", facts,
                  *report(variants, args), quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
