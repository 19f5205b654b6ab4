"""Processes and probes for integration tests: the agent, a real Prometheus, promtool.

Everything here talks to 127.0.0.1 only, every wait is bounded in time and count and fails
with a message that says what was awaited, and every process started is registered so that
teardown (and the failure report, see conftest.py) can find it.

    port = free_port()
    with AgentProcess(["--sim", "8"], workdir=tmp_path / "agent") as agent:   # waits for /healthz 200
        families = agent.metrics()                     # {name: prometheus_client Metric}
        value(families, "gpumond_gpu_up", gpu="3")     # one sample's value, or None when absent
        with PrometheusServer([agent.address], workdir=tmp_path / "prom") as prom:
            prom.wait_for('count(gpumond_gpu_up == 1)', lambda r: scalar(r) == 8, timeout=30)
    rc, out = promtool_check_metrics(agent.metrics_text())
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvicorn
import yaml
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from tests.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"

# Bounds shared by every wait below (seconds).
HTTP_TIMEOUT_S = 5.0
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.1
LOG_TAIL_CHARS = 4000

T = TypeVar("T")

# Every ManagedProcess ever started in this pytest run, in start order (conftest.py reads it
# to attach logs to failed tests and to kill anything a test forgot).
REGISTRY: list[ManagedProcess] = []


# ----- small utilities ------------------------------------------------------------------------
def require_binary(name: str) -> str:
    """The path of `name` on PATH; FAIL (never skip: CI installs them) when it is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name!r} is not installed (not on PATH); run `bash scripts/test.sh`, which installs "
                    f"it with apt-get, or `apt-get install prometheus` yourself", pytrace=False)
    return path


def wait_until(probe: Callable[[], T], *, timeout: float, what: str, interval: float = POLL_INTERVAL_S,
               describe: Callable[[], str] | None = None) -> T:
    """Call `probe` until it returns something truthy; fail after `timeout` s saying what was awaited.

    The loop is bounded in time and in count (timeout / interval + 1 attempts, at least 2).
    Exceptions from the probe count as "not yet" and the last one is shown on failure.
    """
    deadline = time.monotonic() + timeout
    attempts = max(2, int(timeout / interval) + 1)
    last: object = None
    for _ in range(attempts):
        try:
            last = probe()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - any failure is "not yet"; shown if we give up
            last = e
        if time.monotonic() >= deadline:
            break
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
    extra = f"\n{describe()}" if describe is not None else ""
    pytest.fail(f"timed out after {timeout:g}s waiting for {what}; last result: {_short(last)}{extra}",
                pytrace=False)


def _short(v: object, limit: int = 600) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[:limit] + "…"


def http_get(url: str, headers: Mapping[str, str] | None = None,
             timeout: float = HTTP_TIMEOUT_S, context: ssl.SSLContext | None = None) -> tuple[int, dict[str, str], bytes]:
    """GET `url` (loopback only) → (status, lower-cased headers, raw body); no automatic decompression.

    An https URL is verified with `context` (CA, client certificate)."""
    host = urllib.parse.urlsplit(url).hostname
    assert host == LOOPBACK, f"integration tests talk to {LOOPBACK} only, not {host!r}"
    req = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def parse_metrics(text: str) -> dict[str, Metric]:
    """Prometheus text → {family name: Metric} with prometheus-client's reference parser."""
    return {m.name: m for m in text_string_to_metric_families(text)}


def samples(families: Mapping[str, Metric], name: str, **labels: str) -> list[Any]:
    """Samples named `name` (a sample name, e.g. `..._total`) whose labels include `labels`."""
    family = families.get(name) or families.get(name.removesuffix("_total"))
    if family is None:
        return []
    return [s for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def follow_clocks(agents: Mapping[str, Any], factors: Any, stop: threading.Event, name: str) -> threading.Thread:
    """Start a thread that sets each simulated rank's compute factor from its agent's SM clock: a GPU at a
    fraction of its maximum clock computes that much slower (`factors` is gpumond.demo.job.ClockFactors)."""

    def run() -> None:
        while not stop.wait(0.5):
            for node, a in agents.items():
                try:
                    fams = parse_metrics(a.metrics_text())
                except Exception:  # noqa: BLE001 - a lost scrape only delays the next update
                    continue
                maxes = {s.labels["gpu"]: s.value for s in samples(fams, "gpumond_gpu_sm_clock_max_hertz")}
                for s in samples(fams, "gpumond_gpu_sm_clock_hertz"):
                    if s.value > 0 and s.labels["gpu"] in maxes:
                        factors.set(node, int(s.labels["gpu"]), max(1.0, maxes[s.labels["gpu"]] / s.value))

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def value(families: Mapping[str, Metric], name: str, **labels: str) -> float | None:
    """The value of the one sample matching; None when absent; error when ambiguous."""
    found = samples(families, name, **labels)
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples: {found}"
    return found[0].value if found else None


def scalar(result: Sequence[Mapping[str, Any]]) -> float | None:
    """The value of a one-element instant-vector query result, else None."""
    if len(result) != 1:
        return None
    return float(result[0]["value"][1])


def by_label(result: Iterable[Mapping[str, Any]], label: str) -> dict[str, float]:
    """Instant-vector result → {label value: sample value}."""
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in result}


def write_yaml(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


# What promtool's linter says about dcgm-exporter's own names, which a drop-in must keep as they are.
DCGM_NAMING_LINT = re.compile(r"^DCGM_FI_(?:DEV|PROF)_\w+ (label names should be written in 'snake_case' not 'camelCase'"
                              r'|counter metrics should have "_total" suffix'
                              r"|metric name should not include type 'counter')$")


def promtool_check_metrics(text: str | bytes, timeout: float = 30.0) -> tuple[int, str]:
    """`promtool check metrics` on exposition `text` (stdin) → (exit code, stdout+stderr)."""
    promtool = require_binary("promtool")
    data = text.encode() if isinstance(text, str) else text
    r = subprocess.run([promtool, "check", "metrics"], input=data, capture_output=True, timeout=timeout,
                       check=False)
    return r.returncode, (r.stdout + r.stderr).decode(errors="replace")


@contextlib.contextmanager
def served(app: object, timeout: float = START_TIMEOUT_S) -> Iterator[str]:
    """An ASGI app under a real uvicorn in a thread on 127.0.0.1 (a socket bound to port 0 first): its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK, 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                           log_config=None))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), timeout=timeout, what="uvicorn to start")
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://{LOOPBACK}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        assert not thread.is_alive(), "uvicorn did not stop within 10 s"


# ----- processes ------------------------------------------------------------------------------
class ManagedProcess:
    """A child process with stdout/stderr in files, always terminated: SIGTERM, bounded wait, SIGKILL.

    A server subclass sets `port` and `ready_path`: `start()` spawns it and waits (bounded) until GET
    `ready_path` answers 200, failing with its logs (and stopping it) if it exits or never does.
    """

    label = "process"
    ready_path = "/healthz"
    port: int
    tls: ssl.SSLContext | None = None  # set for a server serving https: how the test reaches (and trusts) it

    def __init__(self, argv: Sequence[str], workdir: Path, *, env: Mapping[str, str] | None = None) -> None:
        self.argv = [str(a) for a in argv]
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.stdout_path = self.workdir / f"{self.label}.stdout"
        self.stderr_path = self.workdir / f"{self.label}.stderr"
        self.env = dict(env) if env is not None else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.address}"

    url = base_url

    # lifecycle
    def start(self: T, timeout: float = START_TIMEOUT_S) -> T:
        """Spawn and wait (bounded) until it is ready; stopped again if it never is."""
        self.spawn()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def ready(self) -> bool:
        """Whether it serves yet (GET `ready_path` answers 200)."""
        return http_get(f"{self.base_url}{self.ready_path}", timeout=1.0, context=self.tls)[0] == 200

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        what = f"{self.label}: GET {self.base_url}{self.ready_path} to answer 200"

        def probe() -> bool:
            self._fail_if_exited(what)
            return self.ready()

        wait_until(probe, timeout=timeout, what=what, describe=self.describe)

    def spawn(self) -> None:
        assert self.proc is None, f"{self.label} already started"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         cwd=self.workdir, env=self.env)
        REGISTRY.append(self)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT_S, sig: int = signal.SIGTERM) -> int:
        """Send `sig` (SIGTERM), wait up to `timeout` s, then SIGKILL; returns the exit code.

        A process killed after the timeout returns -SIGKILL (-9), which no test accepts as clean.
        Safe to call twice.
        """
        if self.proc is None:
            raise RuntimeError(f"{self.label} was never started")
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_S)
        self.returncode = self.proc.returncode
        return self.returncode

    def wait_exit(self, timeout: float) -> int:
        """Wait (bounded) for the process to exit on its own; fail with its logs if it does not."""
        assert self.proc is not None
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"{self.label} did not exit within {timeout:g}s\n{self.describe()}", pytrace=False)
        return self.returncode

    def __enter__(self: T) -> T:
        if self.proc is None and "port" in vars(self):  # a server: started (and waited for) on entry
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.stop()

    # output
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def describe(self, tail: int = LOG_TAIL_CHARS) -> str:
        """Command, state and the tail of both output files, for failure messages."""
        state = ("not started" if self.proc is None else
                 "running" if self.proc.poll() is None else f"exited with {self.proc.returncode}")
        parts = [f"--- {self.label} ({state}): {' '.join(self.argv)}"]
        for name, text in (("stdout", self.stdout()), ("stderr", self.stderr())):
            if text:
                cut = text if len(text) <= tail else "…" + text[-tail:]
                parts.append(f"--- {self.label} {name} ({self.workdir / (self.label + '.' + name)}):\n{cut}")
        return "\n".join(parts)

    def _fail_if_exited(self, what: str) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            pytest.fail(f"{self.label} exited ({self.proc.returncode}) while waiting for {what}\n"
                        f"{self.describe()}", pytrace=False)


class AgentProcess(ManagedProcess):
    """`python -m gpumond.cli agent …` on 127.0.0.1:<free port>.

    `args` are the agent's flags; `--listen 127.0.0.1:<port>` is added unless `listen=False`
    (or `args` already has --listen). Construct, then `start()` (or use it as a context
    manager, which starts it and stops it). `run()` is for invocations that should exit by
    themselves (bad config, port in use).
    """

    label = "agent"

    def __init__(self, args: Sequence[str | Path], workdir: Path, *, port: int | None = None,
                 listen: bool = True, env: Mapping[str, str] | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        args = [str(a) for a in args]
        self.tls = tls  # set for an agent serving https (its --web.config.file): how the test reaches it
        self.port = port if port is not None else free_port()
        if listen and "--listen" not in args:
            args = [*args, "--listen", f"{LOOPBACK}:{self.port}"]
        full_env = dict(os.environ if env is None else env)
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        super().__init__([sys.executable, "-m", "gpumond.cli", "agent", *args], workdir, env=full_env)

    def wait_healthy(self, timeout: float = START_TIMEOUT_S) -> None:
        self.wait_ready(timeout)

    def get(self, path: str, headers: Mapping[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        return http_get(f"{self.base_url}{path}", headers, context=self.tls)

    def metrics_text(self) -> str:
        status, _, body = self.get("/metrics")
        assert status == 200, f"GET /metrics answered {status}: {body[:500]!r}\n{self.describe()}"
        return body.decode("utf-8")

    def metrics(self) -> dict[str, Metric]:
        """GET /metrics, parsed: {family name: prometheus_client Metric}."""
        return parse_metrics(self.metrics_text())

    def wait_for_metrics(self, predicate: Callable[[dict[str, Metric]], Any], *, timeout: float,
                         what: str) -> dict[str, Metric]:
        """Poll /metrics until `predicate(families)` is truthy; returns those families."""
        def probe() -> tuple[dict[str, Metric]] | None:
            self._fail_if_exited(what)
            fams = self.metrics()
            return (fams,) if predicate(fams) else None

        return wait_until(probe, timeout=timeout, what=f"{what} (on {self.base_url}/metrics)",
                          interval=0.2, describe=self.describe)[0]

    @classmethod
    def run(cls, args: Sequence[str | Path], workdir: Path, *, timeout: float = 30.0,
            listen: bool = True, port: int | None = None, env: Mapping[str, str] | None = None) -> AgentProcess:
        """Start an agent that is expected to exit by itself; wait (bounded) for the exit."""
        agent = cls(args, workdir, listen=listen, port=port, env=env)
        agent.spawn()
        agent.wait_exit(timeout)
        return agent


class PrometheusServer(ManagedProcess):
    """A real Prometheus on 127.0.0.1:<free port> scraping `targets` every second.

    `targets` are "127.0.0.1:PORT" strings, all in job `job`. Its TSDB lives under `workdir`.
    """

    label = "prometheus"
    ready_path = "/-/ready"

    def __init__(self, targets: Sequence[str], workdir: Path, *, job: str = "gpumond",
                 port: int | None = None, scrape_interval: str = "1s",
                 extra_scrape_configs: Sequence[Mapping[str, Any]] = ()) -> None:
        binary = require_binary("prometheus")
        for t in targets:
            assert t.startswith(f"{LOOPBACK}:"), f"scrape targets must be on {LOOPBACK}, got {t!r}"
        self.port = port if port is not None else free_port()
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "prometheus.yml"
        write_yaml(self.config_path, {
            "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval,
                       "evaluation_interval": scrape_interval},
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets)}]},
                               *extra_scrape_configs],
        })
        super().__init__([binary, f"--config.file={self.config_path}",
                          f"--storage.tsdb.path={workdir / 'data'}",
                          f"--web.listen-address={LOOPBACK}:{self.port}",
                          "--web.enable-lifecycle", "--log.level=warn"], workdir)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query via /api/v1/query → the result list (vector results; scalars as one element)."""
        url = f"{self.base_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        status, _, body = http_get(url)
        payload = json.loads(body)
        assert status == 200 and payload.get("status") == "success", \
            f"query {promql!r} failed ({status}): {body[:500]!r}"
        data = payload["data"]
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def wait_for(self, promql: str, predicate: Callable[[list[dict[str, Any]]], Any] = bool, *,
                 timeout: float = 30.0, what: str | None = None) -> list[dict[str, Any]]:
        """Poll `promql` until `predicate(result)` is truthy (default: non-empty); returns the result."""
        def probe() -> tuple[list[dict[str, Any]]] | None:
            self._fail_if_exited(f"query {promql!r}")
            result = self.query(promql)
            return (result,) if predicate(result) else None  # a 1-tuple: an empty result can satisfy

        return wait_until(probe, timeout=timeout, interval=0.25,
                          what=what or f"{self.label} query {promql!r} to satisfy the predicate",
                          describe=lambda: self.describe() + "\n" + self._targets_summary())[0]

    def targets(self) -> list[dict[str, Any]]:
        status, _, body = http_get(f"{self.base_url}/api/v1/targets")
        assert status == 200, body[:500]
        return list(json.loads(body)["data"]["activeTargets"])

    def _targets_summary(self) -> str:
        try:
            return "--- prometheus targets: " + "; ".join(
                f"{t['scrapeUrl']} health={t['health']} lastError={t['lastError']!r}" for t in self.targets())
        except Exception as e:  # noqa: BLE001 - diagnostics only
            return f"--- prometheus targets: unavailable ({e!r})"
