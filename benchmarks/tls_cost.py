"""What TLS costs the daemons: server CPU per /metrics scrape (agent, 8 simulated GPUs) and per pushed step
(rules service), plain HTTP against TLS 1.3 and against mutual TLS, with certificates made for the run.

Servers, all started by this script on 127.0.0.1 and running for the whole benchmark:
- three agents (`gpumond agent --sim 8`): plain, TLS (`--web.config.file`, NoClientCert), mutual TLS
  (RequireAndVerifyClientCert);
- three rules services, likewise.

Client patterns (this process, the standard library's http.client and ssl, as the job SDK uses them):
- scrape, kept alive: one connection for every scrape, as Prometheus keeps its connection (keep-alive 75 s);
- scrape, new connection: a TCP connect and a full TLS handshake for every scrape (the worst case: a scraper
  that never reuses connections);
- push: the job SDK's own transport (gpumond.job.transport.HttpTransport, keep-alive), bodies of
  STEPS_PER_PUSH steps, as the SDK batches a busy rank's steps.

Cost = (utime + stime of the server process over the load window, /proc/PID/stat) ÷ requests, minus the
server's idle rate over an equal window (the agent samples at 1 Hz whatever the load). Cells run in rounds,
shuffled within each round, so every variant sees the same machine; the table gives the median over rounds
and the TLS / plain ratio of medians.

    python benchmarks/tls_cost.py            # ~3 min
    python benchmarks/tls_cost.py --quick    # ~20 s (smoke test)
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import ssl
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _bench  # noqa: E402
import yaml  # noqa: E402

from gpumond.job.transport import HttpTransport  # noqa: E402
from gpumond.wire.tlsclient import ClientTLS  # noqa: E402
from tests.pki import CA  # noqa: E402

TOKEN = "tls-benchmark-token-0123456789"
STEPS_PER_PUSH = 64
VARIANTS = ("plain", "tls", "mtls")


def web_config(directory: Path, ca: CA, variant: str) -> Path | None:
    if variant == "plain":
        return None
    server = ca.issue(f"server-{variant}", directory=directory)
    tls = {"cert_file": str(server.cert), "key_file": str(server.key)}
    if variant == "mtls":
        tls |= {"client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(ca.path)}
    path = directory / f"web-{variant}.yml"
    path.write_text(yaml.safe_dump({"tls_server_config": tls}))
    return path


class Server:
    """One daemon process and how to reach it."""

    def __init__(self, kind: str, variant: str, workdir: Path, ca: CA, client: ClientTLS) -> None:
        self.kind, self.variant = kind, variant
        self.port = _bench.free_port()
        web = web_config(workdir, ca, variant)
        self.context = None if variant == "plain" else client.context if variant == "mtls" else ClientTLS(ca.path).context
        if kind == "agent":
            argv = ["agent", "--sim", "8", "--listen", f"127.0.0.1:{self.port}", "--log-level", "warning"]
            if web is not None:
                argv += ["--web.config.file", str(web)]
        else:
            cfg = workdir / f"rules-{variant}.yaml"
            cfg.write_text(yaml.safe_dump({"listen": f"127.0.0.1:{self.port}", "tokens": [TOKEN],
                                           "state_dir": str(workdir / f"state-{variant}"),
                                           "limits": {"pushes_per_second_per_client": 1_000_000, "burst": 1_000_000},
                                           "log": {"level": "warning"},
                                           **({"web_config_file": str(web)} if web else {})}))
            argv = ["rules", "--config", str(cfg)]
        self.proc = _bench.Proc(f"{kind} {variant}", [sys.executable, "-m", "gpumond.cli", *argv],
                                workdir / f"{kind}-{variant}.log").start()
        self.scheme = "http" if variant == "plain" else "https"
        _bench.wait_for(self._healthy, 60, f"{kind} {variant} /healthz", self.proc)

    def connection(self) -> http.client.HTTPConnection:
        if self.context is None:
            return http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10, context=self.context)

    def _healthy(self) -> bool:
        try:
            conn = self.connection()
            conn.request("GET", "/healthz")
            ok = conn.getresponse().status == 200
            conn.close()
            return ok
        except OSError:
            return False

    def cpu(self) -> float:
        return _bench.proc_cpu_s(self.proc.pid)


def scrape_load(server: Server, seconds: float, *, reuse: bool) -> int:
    """GET /metrics (gzip, as Prometheus asks) for `seconds`; the number of scrapes."""
    n, conn = 0, server.connection()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not reuse:
            conn = server.connection()
        conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 200 and body, resp.status
        if not reuse:
            conn.close()
        n += 1
    conn.close()
    return n


def push_load(server: Server, seconds: float, client: ClientTLS, ca: CA) -> int:
    """Pushes of STEPS_PER_PUSH steps through the SDK's transport for `seconds`; the number of steps pushed."""
    tls = None if server.variant == "plain" else client if server.variant == "mtls" else ClientTLS(ca.path)
    transport = HttpTransport(f"{server.scheme}://127.0.0.1:{server.port}", TOKEN, tls)
    job, steps, first = f"bench-{uuid.uuid4().hex[:8]}", 0, 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now = time.time()
        body = json.dumps({"job": job, "rank": 0, "world_size": 1, "node": "bench", "gpu_uuid":
                           "GPU-00000000-0000-4000-8000-000000000026",
                           "steps": [{"step": first + i, "end": now - (STEPS_PER_PUSH - i) * 0.01, "duration_s": 0.01,
                                      "data_wait_s": 0.001} for i in range(STEPS_PER_PUSH)]}).encode()
        reply = transport.post(body, 10.0)
        assert reply.status == 202, reply
        first += STEPS_PER_PUSH
        steps += STEPS_PER_PUSH
    transport.close()
    return steps


def measure(server: Server, seconds: float, load) -> tuple[float, int]:
    """(server CPU seconds, units) over one load window."""
    before = server.cpu()
    units = load()
    return server.cpu() - before, units


def idle_rate(server: Server, seconds: float) -> float:
    before = server.cpu()
    time.sleep(seconds)
    return (server.cpu() - before) / seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a short smoke run; its numbers are not for quoting")
    args = p.parse_args(argv)
    rounds, window = (1, 1.0) if args.quick else (7, 6.0)  # quick: one 1 s window per cell, a smoke run only
    work = Path(tempfile.mkdtemp(prefix="gpumond-tls-bench-"))
    ca = CA(work / "pki")
    issued = ca.issue("client", client=True)
    client = ClientTLS(ca.path, issued.cert, issued.key)
    servers = {(kind, v): Server(kind, v, work, ca, client) for kind in ("agent", "rules") for v in VARIANTS}
    cells = [("agent", v, "scrape, kept alive") for v in VARIANTS] + \
            [("agent", v, "scrape, new connection") for v in VARIANTS] + [("rules", v, "push") for v in VARIANTS]
    per_unit: dict[tuple[str, str, str], list[float]] = {c: [] for c in cells}
    rate: dict[tuple[str, str, str], list[float]] = {c: [] for c in cells}
    try:
        time.sleep(2.0)  # the agents' first sample cycles
        idle = {key: idle_rate(s, window) for key, s in servers.items()}
        for _ in range(rounds):
            order = list(cells)
            random.shuffle(order)
            for cell in order:
                kind, variant, pattern = cell
                s = servers[(kind, variant)]
                if pattern == "push":
                    load = lambda s=s: push_load(s, window, client, ca)  # noqa: E731
                else:
                    load = lambda s=s, reuse=pattern.endswith("alive"): scrape_load(s, window, reuse=reuse)  # noqa: E731
                t0 = time.monotonic()
                cpu, units = measure(s, window, load)
                wall = time.monotonic() - t0
                per_unit[cell].append(max(0.0, cpu - idle[(kind, variant)] * wall) / units)
                rate[cell].append(units / wall)
    finally:
        for s in servers.values():
            s.proc.terminate(10)
    rows = []
    for kind, pattern, unit in (("agent", "scrape, kept alive", "scrape"), ("agent", "scrape, new connection", "scrape"),
                                ("rules", "push", "pushed step")):
        plain = statistics.median(per_unit[(kind, "plain", pattern)])
        for variant in VARIANTS:
            cell = (kind, variant, pattern)
            med = statistics.median(per_unit[cell])
            lo, hi = min(per_unit[cell]), max(per_unit[cell])
            rows.append([kind, pattern, variant, f"{_bench.fmt_us(med)} per {unit}",
                         f"{_bench.fmt_us(lo)} – {_bench.fmt_us(hi)}", f"{med / plain:.2f}×" if plain else "–",
                         f"{statistics.median(rate[cell]):.0f}/s"])
    table = _bench.md_table(["server", "pattern", "transport", "server CPU (median)", "min – max over rounds",
                             "vs plain", "units served"], rows)
    text = f"""# TLS cost: server CPU per scrape and per pushed step, plain vs TLS vs mutual TLS

{_bench.machine_block({"rounds": f"{rounds} × {window:g} s per cell, shuffled within each round",
                       "agent": "gpumond agent --sim 8 (gzip /metrics, as Prometheus asks)",
                       "push": f"{STEPS_PER_PUSH} steps per push through gpumond.job.transport.HttpTransport",
                       "TLS": f"{ssl.OPENSSL_VERSION}; TLS 1.3, ECDSA P-256 certificates made for the run"})}

Server CPU = process utime + stime over the window minus the server's idle rate (the agent samples at 1 Hz
whatever the load) ÷ scrapes or pushed steps. "units served" is the closed-loop rate this one Python client
reached: scrapes per second, or steps per second for pushes.

{table}

How to read it: with kept-alive connections (Prometheus, the job SDK) TLS adds only the symmetric
encryption of each response and the record layer in Python's asyncio; the handshake is paid once per
connection. A scraper that opens a new connection for every scrape pays a full handshake (ECDHE + ECDSA,
plus verifying the client's certificate under mutual TLS) on every one.
"""
    _bench.write_result("tls_cost_quick" if args.quick else "tls_cost", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
