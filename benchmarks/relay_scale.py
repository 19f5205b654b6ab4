"""Pushes through node relays against direct pushes: the rules shard's ingest CPU, push latency, steps accepted.

The fleet of the issue's target: NODES nodes × 8 ranks, each rank stepping twice a second, all of one job. Two
ways its steps reach one rules shard, the real `gpumond rules` daemon started fresh for each:

- **direct**: every rank pushes its own 10 steps every 5 s (the SDK's default interval) over a kept-alive
  connection of its own, in the columnar encoding, as the job SDK encodes it;
- **relay**: every node's relay pushes once every 2 s (its default `relay.interval_s`): one batched push
  (gpumond.wire.batch, the format the agent's relay sends) holding each of its 8 ranks' 4 new steps, over one
  kept-alive connection per node.

Each sender keeps its own phase within its interval, open loop: a push is due at its time whether or not the one
before it was answered (it waits for that one on its connection, and the wait counts in its latency). The
service's CPU is read from /proc/PID/stat over a measuring window after one interval of warm-up, less its idle
rate (measured over a quiet window before any push): ingest only, since the daemon's evaluation is set apart
(`evaluation_interval_s` 3600, `judge_on_steps` off) — evaluation costs the same steps either way, and
docs/deploying.md's capacity model has it. Steps pushed, steps the service said it accepted (each answer), and
its own counter `gpumond_rules_push_steps_total{result="accepted"}` are compared at the end.

The load generators (asyncio, CLIENTS processes) share the machine with the service. The whole 4,096-node fleet
pushing directly is ~6,500 pushes/s, more than this 2-vCPU machine can both generate and serve, so by default
NODES is 512 (one eighth) and the fleet figure is the measured rate × 4,096 / NODES: a push costs the service
less when pushes arrive more densely (results/push_cost_regimes.md), so the scaled figure errs high, for both
ways alike. Passes alternate direct and relay so that a change in the machine's load touches both.

    python benchmarks/relay_scale.py                   # 512 nodes, 2 passes of 30 s per way, two 60 s outages (~9 min)
    python benchmarks/relay_scale.py --nodes 4096 --modes relay   # the whole fleet through relays
    python benchmarks/relay_scale.py --quick           # 8 nodes, 2 s windows, a 3 s outage (smoke test, ~35 s)
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import random
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench  # noqa: E402

FLEET_NODES = 4096
RANKS_PER_NODE = 8
STEP_S = 0.5  # two steps a second per rank
TOKEN = "relay-scale-benchmark-token-0123456789"
JOB = "relay-scale-job"
PUSH_PATH = "/api/v1/push"


@dataclass(frozen=True)
class Way:
    """How the fleet's steps reach the shard: one sender per rank (direct) or per node (relay)."""

    name: str
    interval_s: float
    per_node: bool  # one sender per node pushing all its ranks (relay), else one per rank

    @property
    def steps_per_rank_push(self) -> int:
        return round(self.interval_s / STEP_S)


WAYS = {"direct": Way("direct", 5.0, False), "relay": Way("relay", 2.0, True)}


def _uuid(node: int, gpu: int) -> str:
    return f"GPU-{node:08x}-{gpu:04x}-4000-8000-000000000000"


class _Sender:
    """One kept-alive connection pushing on its own schedule: a rank (direct) or a node's relay (batched)."""

    def __init__(self, way: Way, node: int, ranks: list[int], world: int, port: int) -> None:
        from gpumond.job.payload import encode_head
        from gpumond.wire.media import BATCH_COLUMNS_TYPE, CONTENT_TYPES

        self.way, self.port = way, port
        self.heads = [encode_head({"job": JOB, "rank": r, "world_size": world, "node": f"node-{node:05d}",
                                   "gpu_uuid": _uuid(node, r % RANKS_PER_NODE)}, "columns") for r in ranks]
        self.content_type = BATCH_COLUMNS_TYPE if way.per_node else CONTENT_TYPES["columns"]
        self.rng = random.Random(node * 1000 + ranks[0])
        self.phase = self.rng.uniform(0, way.interval_s)
        self.next_step = 0
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    def body(self, now: float) -> tuple[bytes, int]:
        """The next push (every rank's next steps ending at `now`) and how many steps it carries."""
        from gpumond.job.payload import encode_columns
        from gpumond.wire.batch import encode_columns_batch

        n, first = self.way.steps_per_rank_push, self.next_step
        self.next_step += n
        pushes = []
        for head in self.heads:
            u = self.rng.random
            recs = [(first + i, now - (n - 1 - i) * STEP_S, STEP_S * (0.97 + 0.06 * u()), 0.01 * (0.8 + 0.4 * u()),
                     32, 0.1 * (0.8 + 0.4 * u())) for i in range(n)]
            pushes.append(encode_columns(head, recs, 0.0, 0.0))
        body = encode_columns_batch(JOB, pushes) if self.way.per_node else pushes[0]
        return body, n * len(self.heads)

    async def _exchange(self, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        self.writer.write(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nContent-Type: %s\r\n"
                          b"Content-Length: %d\r\n\r\n" % (PUSH_PATH.encode(), TOKEN.encode(),
                                                           self.content_type.encode(), len(body)) + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        return status, await self.reader.readexactly(length)

    async def push(self, body: bytes) -> tuple[int, bytes]:
        """POST one body; a connection the server closed while idle is reopened once, as an HTTP client does."""
        for attempt in (1, 2):
            try:
                return await self._exchange(body)
            except (OSError, asyncio.IncompleteReadError, ValueError):
                if self.writer is not None:
                    self.writer.close()
                self.reader = self.writer = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def _run_senders(senders: list[_Sender], t0: float, measure: tuple[float, float]) -> dict:
    """Every sender pushes from t0 until the end of the measuring window; latencies of pushes due inside it."""
    loop = asyncio.get_running_loop()
    clock = time.monotonic
    out = {"due_lat": [], "req_lat": [], "sent": 0, "accepted": 0, "failed": [], "pushes": 0}

    async def run(s: _Sender) -> None:
        k = 0
        while (due := t0 + s.phase + k * s.way.interval_s) < measure[1]:
            k += 1
            await asyncio.sleep(max(0.0, due - clock()))
            body, steps = s.body(time.time())
            start = clock()
            try:
                status, answer = await s.push(body)
            except (OSError, asyncio.IncompleteReadError, ValueError) as e:
                out["failed"].append(f"{type(e).__name__}: {e}")
                continue
            done = clock()
            out["sent"] += steps
            out["pushes"] += 1
            got = _bench.accepted_steps(status, answer, s.way.per_node)
            out["accepted"] += got
            if got != steps:
                out["failed"].append(f"HTTP {status}: {answer[:200]!r}")
            if measure[0] <= due:
                out["due_lat"].append(done - due)
                out["req_lat"].append(done - start)
        s.close()

    del loop
    await asyncio.gather(*(run(s) for s in senders))
    return out


def _client(way: Way, nodes: list[int], world: int, port: int, t0: float, measure: tuple[float, float],
            done: mp.Queue) -> None:
    """A load-generator process: its share of the senders, on one event loop; reports back on `done`."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # one descriptor per rank's connection
    senders = []
    for node in nodes:
        ranks = [node * RANKS_PER_NODE + g for g in range(RANKS_PER_NODE)]
        if way.per_node:
            senders.append(_Sender(way, node, ranks, world, port))
        else:
            senders += [_Sender(way, node, [r], world, port) for r in ranks]
    cpu0 = time.process_time()
    out = asyncio.run(_run_senders(senders, t0, measure))
    out["cpu_s"] = time.process_time() - cpu0
    out["failed_n"] = len(out["failed"])
    out["failed"] = out["failed"][:5]
    done.put(out)


def _start_rules(work: Path, nodes: int) -> tuple[_bench.Proc, str, int]:
    """A fresh `gpumond rules`: ingest as shipped, evaluation set apart, room for every rank's connection; (its
    process, its base URL, its port)."""
    proc, base = _bench.start_rules(
        work, [TOKEN], log={"level": "warning"},
        evaluation_interval_s=3600, judge_on_steps={"enabled": False}, power_slack={"enabled": False},
        # Every load generator pushes from 127.0.0.1: the per-client rate limit would refuse the fleet's pushes.
        limits={"pushes_per_second_per_client": 1_000_000, "burst": 1_000_000, "max_ranks": 65_536},
        # A connection per rank in the direct way; a shard of a large fleet is given this much (docs/deploying.md).
        http={"max_connections": max(4096, nodes * RANKS_PER_NODE + 1024)})
    return proc, base, int(base.rsplit(":", 1)[1])


def _metric(text: str, name: str, labels: str = "") -> float:
    prefix = f"{name}{{{labels}}} " if labels else f"{name} "
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def _busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def run_way(way: Way, nodes: int, clients: int, window_s: float, idle_s: float, tmp: Path) -> dict:
    """One pass of one way against a fresh rules daemon."""
    proc, base, port = _start_rules(tmp / f"rules-{way.name}-{time.time_ns()}", nodes)
    try:
        c0, i0 = _bench.proc_cpu_s(proc.pid), time.monotonic()
        time.sleep(idle_s)
        idle_rate = (_bench.proc_cpu_s(proc.pid) - c0) / (time.monotonic() - i0)
        t0 = time.monotonic() + 1.0
        warm = way.interval_s + 1.0
        measure = (t0 + warm, t0 + warm + window_s)
        ctx = mp.get_context("fork")
        done: mp.Queue = ctx.Queue()
        workers = [ctx.Process(target=_client, args=(way, list(range(nodes))[i::clients], nodes * RANKS_PER_NODE,
                                                     port, t0, measure, done), daemon=True) for i in range(clients)]
        for w in workers:
            w.start()
        time.sleep(max(0.0, measure[0] - time.monotonic()))
        cpu_a, busy_a = _bench.proc_cpu_s(proc.pid), _busy()
        time.sleep(max(0.0, measure[1] - time.monotonic()))
        cpu_b, busy_b = _bench.proc_cpu_s(proc.pid), _busy()
        load1 = os.getloadavg()[0]
        results = [done.get(timeout=window_s + 600) for _ in workers]
        for w in workers:
            w.join(timeout=30)
        metrics = _bench.fetch(base + "/metrics").decode()
        rss_kib = _bench.proc_status_kib(proc.pid, "VmHWM")
    finally:
        proc.terminate()
    service_rate = (cpu_b - cpu_a) / window_s
    due = [x for r in results for x in r["due_lat"]]
    req = [x for r in results for x in r["req_lat"]]
    pushes_in_window = len(due)
    return {
        "way": way, "nodes": nodes, "idle_rate": idle_rate, "service_rate": service_rate,
        "ingest_rate": max(0.0, service_rate - idle_rate), "pushes_per_s": pushes_in_window / window_s,
        "due_p50": _bench.quantile(due, 0.5) if due else float("nan"),
        "due_p99": _bench.quantile(due, 0.99) if due else float("nan"),
        "req_p99": _bench.quantile(req, 0.99) if req else float("nan"),
        "due_max": max(due) if due else float("nan"),
        "sent": sum(r["sent"] for r in results), "accepted_answers": sum(r["accepted"] for r in results),
        "accepted_counter": _metric(metrics, "gpumond_rules_push_steps_total", 'result="accepted"'),
        "not_accepted": {res: _metric(metrics, "gpumond_rules_push_steps_total", f'result="{res}"')
                         for res in ("duplicate", "stale", "per_rank_window", "refused")},
        "failed": sum(r["failed_n"] for r in results), "failures": [f for r in results for f in r["failed"]][:3],
        "client_cpu_rate": sum(r["cpu_s"] for r in results) / (measure[1] - t0),
        "machine_busy": (busy_b[0] - busy_a[0]) / max(1, busy_b[1] - busy_a[1]) * (os.cpu_count() or 1),
        "load1": load1, "rss_mib": rss_kib / 1024,
    }


# ----- the outage: one real relay (a `gpumond agent --sim`), eight real SDK ranks, the rules service away --------
RANK_SCRIPT = """
import json, os, sys, time
import gpumond.job
rep = gpumond.job.init()
end = time.monotonic() + float(sys.argv[1])
n = 0
while time.monotonic() < end:
    time.sleep(0.5)
    gpumond.job.step_end(samples=32)
    n += 1
rep.close(timeout_s=float(sys.argv[2]))
s = rep.stats
print(json.dumps({"recorded": n, "pushed": s.pushed_steps, "dropped": s.dropped_steps, "failed": s.failed_pushes}))
"""


class Switch:
    """A TCP forwarder in front of the rules service that can refuse like a stopped service: `down()` closes its
    listener and every connection through it (a connect is then refused), `up()` listens on the same port again."""

    def __init__(self, target_port: int) -> None:
        import threading

        self.port, self._target = _bench.free_port(), target_port
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._open: set[asyncio.StreamWriter] = set()
        threading.Thread(target=self._loop.run_forever, name="switch", daemon=True).start()
        self.up()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target)
        except OSError:
            writer.close()
            return
        self._open.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        self._open.difference_update((writer, up_writer))

    def _call(self, coro) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def up(self) -> None:
        async def start() -> asyncio.AbstractServer:
            return await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self._server = self._call(start())  # type: ignore[assignment]

    def down(self) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            for w in list(self._open):
                w.transport.abort()  # a reset, as from a process that is gone
            self._open.clear()
        self._call(stop())

    def close(self) -> None:
        self.down()
        self._loop.call_soon_threadsafe(self._loop.stop)


def _relay_metrics(url: str) -> dict[str, float]:
    text = _bench.fetch(url).decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("gpumond_relay_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def outage(kind: str, outage_s: float, before_s: float, after_s: float, tmp: Path) -> dict:
    """Eight SDK ranks at 2 steps/s push to one real relay; the rules service goes away for `outage_s`:
    refused (nothing listens: a stopped or restarting service) or hung (its process stopped: no answer)."""
    agent_port, relay_port = _bench.free_port(), _bench.free_port()
    rules, _, rules_port = _start_rules(tmp / f"outage-rules-{kind}", 1)
    switch = Switch(rules_port) if kind == "refused" else None
    upstream = switch.port if switch else rules_port
    agent_cfg = tmp / f"agent-{kind}.yaml"
    agent_cfg.write_text(json.dumps({"relay": {"upstream": f"http://127.0.0.1:{upstream}"}}))
    agent = _bench.Proc("agent", [sys.executable, "-m", "gpumond.cli", "agent", "--sim", "8", "--config", agent_cfg,
                                  "--listen", f"127.0.0.1:{agent_port}", "--relay-listen", f"127.0.0.1:{relay_port}",
                                  "--state-dir", tmp / f"agent-state-{kind}"], tmp / f"outage-agent-{kind}.log")
    ranks: list[tuple[_bench.Proc, Path]] = []
    samples: list[dict[str, float]] = []
    try:
        agent.start().wait_http(f"http://127.0.0.1:{agent_port}/healthz", 60)
        metrics_url = f"http://127.0.0.1:{agent_port}/metrics"
        time.sleep(2.0)  # past the agent's first samples
        a0, t_a0 = _bench.proc_cpu_s(agent.pid), time.monotonic()
        time.sleep(before_s - 2.0)
        agent_idle = (_bench.proc_cpu_s(agent.pid) - a0) / (time.monotonic() - t_a0)
        rss_idle = _bench.proc_status_kib(agent.pid, "VmRSS")
        run_s = before_s + outage_s + after_s
        for r in range(RANKS_PER_NODE):
            log = tmp / f"rank-{kind}-{r}.log"
            env = {"GPUMOND_ENDPOINT": f"http://127.0.0.1:{relay_port}", "GPUMOND_TOKEN": TOKEN,
                   "GPUMOND_JOB_ID": f"outage-{kind}", "RANK": str(r), "WORLD_SIZE": str(RANKS_PER_NODE),
                   "GPUMOND_NODE": "sim-node", "GPUMOND_GPU_UUID": _uuid(0, r), "GPUMOND_PUSH_ENCODING": "columns"}
            ranks.append((_bench.Proc(f"rank {r}", [sys.executable, "-c", RANK_SCRIPT, str(run_s), "30"], log,
                                      env=env).start(), log))
        t0 = time.monotonic()
        time.sleep(2.0)  # the ranks' start: imports, first push
        a1, t_a1 = _bench.proc_cpu_s(agent.pid), time.monotonic()
        time.sleep(before_s - 2.0)
        # What relaying added, steady before the outage: the agent's rate less its rate before the ranks.
        agent_busy = (_bench.proc_cpu_s(agent.pid) - a1) / (time.monotonic() - t_a1) - agent_idle
        if switch:
            switch.down()
        else:
            os.kill(rules.pid, 19)  # SIGSTOP
        t_down = time.monotonic()
        while time.monotonic() < t_down + outage_s:
            samples.append(_relay_metrics(metrics_url))
            time.sleep(1.0)
        if switch:
            switch.up()
        else:
            os.kill(rules.pid, 18)  # SIGCONT
        t_up = time.monotonic()
        drained = None
        deadline = t0 + run_s + 120
        while time.monotonic() < deadline:
            m = _relay_metrics(metrics_url)
            samples.append(m)
            if m.get("gpumond_relay_buffer_bytes", 1) == 0 and drained is None:
                drained = time.monotonic() - t_up
            if drained is not None and all(p.returncode is not None for p, _ in ranks):
                break
            time.sleep(1.0)
        reported = []
        for p, log in ranks:
            p.proc.wait(60)  # type: ignore[union-attr]
            reported.append(json.loads(log.read_text().strip().splitlines()[-1]))
        # The relay's last batches: until it has forwarded what the ranks handed it (or it never will).
        handed = sum(r["pushed"] for r in reported)
        _bench.wait_for(lambda: _relay_metrics(metrics_url).get("gpumond_relay_steps_forwarded_total", 0) >= handed,
                        30.0, "the relay to forward its ranks' last steps", agent)
        final = _relay_metrics(metrics_url)
        rules_metrics = _bench.fetch(f"http://127.0.0.1:{rules_port}/metrics").decode()
        counter = _metric(rules_metrics, "gpumond_rules_push_steps_total", 'result="accepted"')
        duplicates = _metric(rules_metrics, "gpumond_rules_push_steps_total", 'result="duplicate"')
        rss_busy = _bench.proc_status_kib(agent.pid, "VmHWM")
    finally:
        for p, _ in ranks:
            p.kill()
        if not switch and rules.alive:
            os.kill(rules.pid, 18)
        agent.terminate()
        rules.terminate()
        if switch:
            switch.close()
    return {"kind": kind, "outage_s": outage_s, "recorded": sum(r["recorded"] for r in reported),
            "pushed": sum(r["pushed"] for r in reported), "sdk_dropped": sum(r["dropped"] for r in reported),
            "accepted": counter, "duplicates": duplicates, "final": final, "drained_s": drained,
            "peak_bytes": max(s.get("gpumond_relay_buffer_bytes", 0) for s in samples),
            "peak_age": max(s.get("gpumond_relay_buffer_oldest_age_seconds", 0) for s in samples),
            "agent_cpu": agent_busy, "agent_rss_mib": (rss_busy - rss_idle) / 1024}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def main(argv: list[str] | None = None) -> int:
    ap = _bench.parser(__doc__, "8 nodes, 2 s windows, one pass, a 3 s refused outage")
    ap.add_argument("--nodes", type=int, help=f"simulated nodes (default 512, quick 8); the fleet figure scales "
                                              f"to {FLEET_NODES:,}")
    ap.add_argument("--modes", nargs="+", choices=sorted(WAYS), default=["direct", "relay"])
    ap.add_argument("--passes", type=int, help="passes of each way, alternating (default 2, quick 1)")
    ap.add_argument("--window-s", type=float, help="measuring window of a pass (default 30, quick 2)")
    ap.add_argument("--idle-s", type=float, default=5.0, help="quiet window for the service's idle CPU (default 5)")
    ap.add_argument("--clients", type=int, default=2, help="load-generator processes (default 2)")
    ap.add_argument("--outage-s", type=float, help="the rules service's outage through one real relay (default 60, "
                                                   "quick 3; 0: none)")
    ap.add_argument("--outage-kinds", nargs="+", choices=("refused", "hung"),
                    help="refused: nothing listens; hung: the service's process stopped (default both, quick refused)")
    ap.add_argument("--name", default="relay_scale", help="result file name under benchmarks/results/")
    args = ap.parse_args(argv)
    outage_s = args.outage_s if args.outage_s is not None else (3.0 if args.quick else 60.0)
    nodes = args.nodes or (8 if args.quick else 512)
    passes = args.passes or (1 if args.quick else 2)
    window = args.window_s or (2.0 if args.quick else 30.0)
    idle = 1.0 if args.quick else args.idle_s
    runs = []
    with tempfile.TemporaryDirectory(prefix="relay-scale-") as tmp:
        for p in range(passes):
            for mode in args.modes:
                print(f"pass {p + 1}: {mode}, {nodes} nodes ...", file=sys.stderr, flush=True)
                runs.append(run_way(WAYS[mode], nodes, args.clients, window, idle, Path(tmp)))
        outages = []
        kinds = args.outage_kinds or (["refused"] if args.quick else ["refused", "hung"])
        for kind in kinds if outage_s > 0 else []:
            print(f"outage: {kind}, {outage_s:g} s ...", file=sys.stderr, flush=True)
            outages.append(outage(kind, outage_s, 3.0 if args.quick else 15.0, 1.0 if args.quick else 10.0,
                                  Path(tmp)))
    scale = FLEET_NODES / nodes
    rows = []
    for i, r in enumerate(runs):
        w = r["way"]
        rows.append([f"{i // len(args.modes) + 1}", w.name, f"every {w.interval_s:g} s", f"{r['pushes_per_s']:,.0f}",
                     f"{r['service_rate']:.3f}", f"{r['idle_rate']:.3f}", f"**{r['ingest_rate']:.3f}**",
                     f"**{r['ingest_rate'] * scale:.2f}**", _ms(r["due_p50"]), f"**{_ms(r['due_p99'])}**",
                     _ms(r["req_p99"]), _ms(r["due_max"]), f"{r['client_cpu_rate']:.2f}",
                     f"{r['machine_busy']:.2f}", f"{r['load1']:.1f}", f"{r['rss_mib']:.0f} MiB"])
    table = _bench.md_table(
        ["pass", "way", "pushes", "pushes/s", "service CPU (cores)", "of which idle", "ingest CPU (cores)",
         f"ingest at {FLEET_NODES:,} nodes (×{scale:g})", "push p50", "push p99", "request p99", "push max",
         "load generators (cores)", "machine busy (cores)", "load (1 min)", "service peak RSS"], rows)
    records = _bench.md_table(
        ["pass", "way", "steps pushed", "accepted (answers)", "accepted (service's counter)", "not accepted (counter)",
         "failed pushes", "**lost** (pushed − accepted)"],
        [[f"{i // len(args.modes) + 1}", r["way"].name, f"{r['sent']:,}", f"{r['accepted_answers']:,}",
          f"{r['accepted_counter']:,.0f}", ", ".join(f"{k} {v:,.0f}" for k, v in r["not_accepted"].items()),
          f"{r['failed']:,}" + (f" ({'; '.join(r['failures'])})" if r["failures"] else ""),
          f"**{r['sent'] - r['accepted_counter']:,.0f}**"] for i, r in enumerate(runs)])
    by_way = {m: [r for r in runs if r["way"].name == m] for m in args.modes}
    lines = []
    if {"direct", "relay"} <= set(by_way):
        for i, (d, r) in enumerate(zip(by_way["direct"], by_way["relay"]), 1):
            ratio = r["ingest_rate"] / d["ingest_rate"] if d["ingest_rate"] else float("nan")
            lines.append(f"- pass {i}: ingest CPU relay ÷ direct = **{ratio:.3f}** (target ≤ 0.25); at "
                         f"{FLEET_NODES:,} nodes {r['ingest_rate'] * scale:.2f} against {d['ingest_rate'] * scale:.2f} "
                         f"cores (target ≤ 1 through relays); push p99 {_ms(r['due_p99'])} against "
                         f"{_ms(d['due_p99'])} (target ≤ 250 ms)")
        cost = {w: sum(x["ingest_rate"] for x in v) / sum(x["pushes_per_s"] for x in v) for w, v in by_way.items()}
        steps = {w: WAYS[w].steps_per_rank_push * (RANKS_PER_NODE if WAYS[w].per_node else 1) for w in by_way}
        per_push = [f"{w}: {cost[w] * 1e3:.3f} ms of service CPU per push, {cost[w] / steps[w] * 1e6:.1f} µs per step"
                    for w in by_way]
        lines.append("- " + "; ".join(per_push) + " (all passes)")
        # What a relay's batch may cost the service for each target, from this run's direct pushes.
        relay_rate = FLEET_NODES / WAYS["relay"].interval_s
        direct_rate = FLEET_NODES * RANKS_PER_NODE / WAYS["direct"].interval_s
        lines.append(f"- for the targets at {FLEET_NODES:,} nodes ({relay_rate:,.0f} batches/s against "
                     f"{direct_rate:,.0f} direct pushes/s), a batch may cost the service at most "
                     f"**{cost['direct'] * direct_rate / relay_rate / 4 * 1e3:.3f} ms** (¼ of direct) and "
                     f"**{1 / relay_rate * 1e3:.3f} ms** (1 core); it cost {cost['relay'] * 1e3:.3f} ms")
    facts = {"setup": f"{nodes:,} nodes × {RANKS_PER_NODE} ranks of one job, 2 steps/s a rank; direct: a push per "
                      f"rank every 5 s (10 steps, columns), a connection per rank; relay: one batched push per node "
                      f"every 2 s (8 ranks × 4 steps), a connection per node; the `gpumond rules` daemon fresh for "
                      f"each pass, evaluation set apart; {args.clients} load-generator processes (asyncio) on the "
                      f"same machine; {window:g} s measuring window after one interval of warm-up",
             "note": "the machine's 2 vCPUs are shared with other work (its load and busy cores are in the table): "
                     "compare the ways within a pass; the fleet figure scales the measured rate linearly"}
    notes_text = (
        "*Service CPU*: utime + stime of the rules daemon over the window, from /proc/PID/stat (100 Hz ticks), as a "
        "share of one core; *of which idle*: its rate over a quiet window before the pass's first push; *ingest "
        "CPU*: the difference. *Push p99*: from the push's due time to its answer (a push waits for the one before "
        "it on its connection); *request*: from writing the request to reading the answer. *Machine busy*: every "
        "CPU's busy time over the window, in cores (the service, the load generators and whatever else ran). "
        "*Accepted (answers)*: the steps the service's answers said it accepted; *service's counter*: "
        "`gpumond_rules_push_steps_total{result=\"accepted\"}` read after the pass.")
    sections = ["## Ingest CPU and push latency\n\n" + table, "\n".join(lines), notes_text, "## Records\n\n" + records]
    if outages:
        sections.append(_outage_section(outages))
    _bench.report(args.name, "# Relayed against direct pushes: one rules shard's ingest", facts, *sections,
                  quick=args.quick)
    lost = [r for r in runs if r["sent"] != r["accepted_counter"] or r["failed"]]
    lost += [o for o in outages if o["recorded"] != o["accepted"]]
    return 1 if lost else 0


def _outage_section(outages: list[dict]) -> str:
    def by_label(final: dict[str, float], name: str) -> str:
        got = {k.split('"')[1]: v for k, v in final.items() if k.startswith(name + "{") and v}
        return ", ".join(f"{k} {v:,.0f}" for k, v in sorted(got.items())) or "0"

    rows = [[o["kind"], f"{o['outage_s']:g} s", f"{o['recorded']:,}", f"{o['pushed']:,}", f"{o['sdk_dropped']:,}",
             f"{o['accepted']:,.0f}", f"{o['duplicates']:,.0f}", f"**{o['recorded'] - o['accepted']:,.0f}**",
             by_label(o["final"], "gpumond_relay_steps_dropped_total"),
             by_label(o["final"], "gpumond_relay_upstream_errors_total"), f"{o['peak_bytes'] / 1024:,.0f} KiB",
             f"{o['peak_age']:.0f} s", "—" if o["drained_s"] is None else f"{o['drained_s']:.1f} s",
             f"{o['agent_cpu'] * 100:.1f} %", f"{o['agent_rss_mib']:+.1f} MiB"] for o in outages]
    table = _bench.md_table(["outage", "for", "steps the ranks made", "handed to the relay (SDK)", "dropped (SDK)",
                             "accepted by the service", "duplicates (re-sent, not stored twice)",
                             "**lost** (made − accepted)", "relay drops", "relay upstream errors", "buffer peak",
                             "oldest held, peak", "drained after the outage", "agent CPU for relaying",
                             "agent RSS, peak − before the ranks"], rows)
    return ("## A rules-service outage through one real relay\n\n" + table + "\n\n"
            "Eight real job-SDK processes (`gpumond.job`, columns) step twice a second and push to one real relay "
            "(`gpumond agent --sim 8`, its default relay settings: 2 s interval, 64 MiB / 600 s buffer), which "
            "pushes to the real `gpumond rules` daemon. *refused*: a forwarder in front of the service closes its "
            "listener and resets its connections, as a stopped or restarting service does, then listens again; "
            "*hung*: the service's process is stopped (SIGSTOP) and continued (SIGCONT): connections open but "
            "nothing answers. The service keeps its store either way, so its counter "
            "`gpumond_rules_push_steps_total{result=\"accepted\"}` counts every step it stored once; re-sent "
            "batches show as duplicates. *Drained*: until the relay's buffer was empty after the service came "
            "back. *Agent CPU for relaying*: the agent's CPU over the ranks' first seconds less its rate before "
            "they started (sampling 8 simulated GPUs), as a share of one core.")


if __name__ == "__main__":
    sys.exit(main())
