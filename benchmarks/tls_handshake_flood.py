"""What a flood of stalled TLS handshakes costs an agent's memory, and how much it gives back once they are closed.

Each connection sends a real ClientHello (tests/handshake_flood.py) and nothing more, so the agent has answered
it and holds the handshake half done until the head timeout closes it. Measured on a real agent
(`gpumond agent --sim 1` serving TLS with certificates made for the run), from outside: VmRSS
(/proc/PID/status) before the flood, once every connection is held (the agent's own
gpumond_http_connections_open says so), and after the head timeout closed them all and the client closed its
ends. Beside it: connections that complete their handshake and then stall in their request head (what a flood
costs once it pays for handshakes), and plain-HTTP connections stalled in their request head, the reference.

With `--before DIR` (e.g. `git archive REV gpumond | tar -x -C DIR`) an agent importing DIR's gpumond is flooded
too, alternating with this tree's: a before/after in one run.

    python benchmarks/tls_handshake_flood.py --before /tmp/before    # ~10 min: 4,000 connections
    python benchmarks/tls_handshake_flood.py --quick                 # ~2 min: 300 connections (smoke test)
"""

from __future__ import annotations

import json
import resource
import ssl
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

_OPEN = "gpumond_http_connections_open "
HALF_A_HEAD = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"  # and never the blank line that ends it
# kind -> (its row, TLS?, the head timeout that closes them: long enough for the client to open them all, as a
# completed handshake costs the client ~100x what a ClientHello does)
KINDS = {"hello": ("TLS, ClientHello then nothing", True, 5.0),
         "established": ("TLS, handshake done, then half a head", True, 40.0),
         "plain": ("plain, half a head", False, 5.0)}


def flood_one(tree: Path | None, kind: str, n: int, work: Path) -> dict:
    """Start an agent (from `tree`'s gpumond; None: this checkout), flood it with `n` stalled connections of `kind`,
    stop it: its RSS before, held and after, in KiB."""
    from tests.handshake_flood import LOOPBACK, close_all, stalled

    _, tls, head_timeout_s = KINDS[kind]
    port = _bench.free_port()
    config = work / "agent.yaml"
    config.write_text(f"http: {{header_timeout_s: {head_timeout_s}}}\nstate_dir: {work / 'state'}\n")
    argv = [sys.executable, "-m", "gpumond.cli", "agent", "--sim", "1", "--listen", f"{LOOPBACK}:{port}",
            "--config", config, "--log-level", "error"]
    context = None
    if tls:
        argv += ["--web.config.file", work / "web.yml"]
        context = ssl.create_default_context(cafile=str(work / "pki" / "ca.crt"))
    env = {"PYTHONPATH": f"{tree}:{_bench.REPO}"} if tree is not None else {}
    # cwd outside the repository: `python -m` puts it first on sys.path, ahead of the --before tree
    agent = _bench.Proc("agent", argv, work / f"agent-{kind}.log", env=env, cwd=work).start()
    url = f"{'https' if tls else 'http'}://{LOOPBACK}:{port}/metrics"

    def held() -> float:
        with urllib.request.urlopen(url, timeout=10, context=context) as r:
            line = next(x for x in r.read().decode().splitlines() if x.startswith(_OPEN))
        return float(line[len(_OPEN):])

    try:
        _bench.wait_for(lambda: held() >= 0, 60, "the agent to answer", agent)
        time.sleep(1.0)
        start = _bench.proc_status_kib(agent.pid, "VmRSS")
        socks = stalled(port, n, None if kind == "hello" else HALF_A_HEAD,
                        tls=context if kind == "established" else None)
        try:
            _bench.wait_for(lambda: held() >= n, 120, f"{n} connections held", agent)
            time.sleep(0.5)
            peak = _bench.proc_status_kib(agent.pid, "VmRSS")
            _bench.wait_for(lambda: held() <= 1, 120, "the head timeout to close them", agent)
        finally:
            close_all(socks)
        time.sleep(3.0)  # the guard releases the heap a second after a burst of closings
        after = _bench.proc_status_kib(agent.pid, "VmRSS")
    finally:
        agent.terminate()
    return {"start": start, "held": peak, "after": after}


def main() -> None:
    ap = _bench.parser(__doc__, "300 connections, one round")
    _bench.before_after_args(ap, "flood")
    ap.add_argument("--connections", type=int, default=4000)
    args = ap.parse_args()
    n = 300 if args.quick else args.connections
    rounds = 1 if args.quick else args.rounds
    _bench.use_test_helpers()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * n + 1024)), hard))
    from tests.pki import CA

    rows: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="tls-flood-") as tmp:
        work = Path(tmp)
        server = CA(work / "pki").issue("tls", days=30)
        (work / "web.yml").write_text(json.dumps({"tls_server_config": {"cert_file": str(server.cert),
                                                                        "key_file": str(server.key)}}))
        for label, tree in _bench.alternating(args, rounds):
            for kind, (row, _, _) in KINDS.items():
                got = flood_one(tree, kind, n, work)
                rows.setdefault((label, row), []).append(got)
                print(label, kind, got, file=sys.stderr)

    table = []
    for (label, kind), runs in rows.items():
        best = min(runs, key=lambda r: r["held"] - r["start"])  # least added: the least disturbed round
        added = best["held"] - best["start"]
        back = best["held"] - best["after"]
        table.append([label, kind, f"{best['start'] / 1024:.0f}", f"{best['held'] / 1024:.0f}",
                      f"{added / n:.1f}", f"{best['after'] / 1024:.0f}", f"{100 * back / added:.0f} %"
                      if added > 0 else "–"])
    headers = ["gpumond", "connections", "RSS before, MiB", "RSS held, MiB", "per connection, KiB",
               "RSS after closing, MiB", "given back"]
    _bench.report("tls_handshake_flood", f"# Stalled TLS handshakes: agent memory held, and given back ({n:,} "
                  f"connections)", {"connections": f"{n:,}, all from one client process on 127.0.0.1",
                                    "head timeout": "5 s (40 s for completed handshakes): it closes them",
                                    "TLS": f"{ssl.OPENSSL_VERSION}; ECDSA P-256 certificate made for the run",
                                    "rounds": f"{rounds} (each row: the round that added least)"},
                  _bench.md_table(headers, table), NOTES, quick=args.quick)


NOTES = """\
"per connection" = (RSS held − RSS before) ÷ connections; "given back" = (RSS held − RSS after closing) ÷
(RSS held − RSS before). Before the fix asyncio's TLS protocol gave every connection a 256 KiB read buffer at
accept, and glibc kept what was freed inside its heaps. Now a connection reads into 4 KiB until its handshake
completes (16 KiB after), and the connection guard hands freed heap pages back (malloc_trim) a second after a
burst of closings. What remains per stalled handshake is mostly OpenSSL's own handshake state (~45 KB, measured
alone with ssl.MemoryBIO), which no Python API bounds: the connection cap and the head timeout bound how many
there are."""


if __name__ == "__main__":
    main()
