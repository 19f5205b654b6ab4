"""Telemetry by scraping every agent's /metrics directly: the embedded default, no Prometheus needed."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpumond import __version__
from gpumond.rules.telemetry import signals
from gpumond.web.client import Access, AccessError, http_client
from gpumond.rules.telemetry.file_sd import FileSD
from gpumond.web.bounded import FetchError, get_bounded
from gpumond.rules.telemetry.mapping import AgentReading, read_agent
from gpumond.rules.telemetry.targets import Target, parse_target
from gpumond.rules.types import AgentAlert, GpuSample, HostSample, TelemetryBatch, TelemetryNeed
from gpumond.wire.safetext import one_line

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_WORKERS = 32
# An 8-GPU agent exposes ~45 KiB; anything near this is not an agent and must not exhaust memory.
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024

_HEADERS = {
    # The classic text format: prometheus-client's parser for it is the one we use.
    "Accept": "text/plain;version=0.0.4",
    "Accept-Encoding": "gzip",
    "User-Agent": f"gpumond-rules/{__version__}",
}


# Sample lines of the families we map start with one of these; the rest of the exposition is not parsed.
_WANTED = tuple(f"{name}{sep}" for name in sorted({
    signals.INFO, signals.GPU_UP, signals.JOB_INFO, signals.MIG_INFO, signals.ALERT_ACTIVE,
    *(metric for metric, _ in signals.GPU_SERIES.values()), *signals.HOST_SERIES.values(),
}) for sep in ("{", " ", "\t"))


def wanted_lines(text: str) -> str:
    """Only the sample lines of the families we map (HELP/TYPE dropped: mapping goes by sample name)."""
    # prometheus-client's parser costs ~60 µs a sample; an 8-GPU agent exposes ~380 samples, we map ~140.
    # Split on "\n" only: label values may hold other Unicode line breaks, which str.splitlines() would cut.
    return "".join(f"{line}\n" for line in text.split("\n") if line.startswith(_WANTED))


class ScrapeSource:
    """Scrapes agents concurrently; a target that fails is absent and never fails the others."""

    name = "scrape"

    def __init__(self, targets: Sequence[str] = (), file_sd: Path | str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, client: httpx.Client | None = None,
                 clock: Callable[[], float] = time.time, max_workers: int = DEFAULT_MAX_WORKERS,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, scheme: str = "http",
                 access: Access | None = None) -> None:
        if timeout_s <= 0 or max_workers < 1 or max_body_bytes < 1:
            raise ValueError("timeout_s, max_workers and max_body_bytes must be positive")
        # Static targets come from validated config: a bad one is a config error, raised now.
        defaults = {"__scheme__": scheme}
        self._static = [parse_target(t, defaults) for t in targets]
        self._file_sd = FileSD(file_sd, defaults=defaults) if file_sd is not None else None
        self._access = access if access is not None else Access()
        self._headers = dict(_HEADERS)
        self._timeout_s = float(timeout_s)
        self._max_body = max_body_bytes
        self._clock = clock
        self._owns_client = client is None
        self._client = client or http_client(
            self._access, limits=httpx.Limits(max_connections=max_workers, max_keepalive_connections=max_workers))
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="gpumond-scrape")
        self._nodes: dict[str, str] = {}  # url → node name from its last good scrape, to name it when it fails

    def fetch(self, need: TelemetryNeed | None = None) -> TelemetryBatch:
        """Scrape every current target once; bounded by the per-target timeout. `need` does not narrow it: an
        agent's /metrics is one answer, and which node holds a needed GPU is known only from that answer."""
        t = self._clock()
        errors: list[str] = []
        if problem := self._access.refresh():
            errors.append(f"scrape: changed certificate files not used: {problem}")
        try:
            self._headers = _HEADERS | self._access.headers()
        except AccessError as e:  # the previous credentials are tried; the error says why they may fail
            errors.append(f"scrape: {e}")
        targets = self._targets(errors)
        outcomes = list(self._pool.map(self._scrape_safely, targets))
        gpus: dict[str, GpuSample] = {}
        hosts: list[HostSample] = []
        alerts: list[AgentAlert] = []
        absent: set[str] = set()
        for target, outcome in zip(targets, outcomes, strict=True):
            if isinstance(outcome, str):
                absent.add(target.node or self._nodes.get(target.url) or target.host)
                errors.append(f"scrape {target.address}: {outcome}")
                continue
            self._nodes[target.url] = outcome.node
            for g in outcome.gpus:
                first = gpus.setdefault(g.uuid, g)
                if first is not g:  # the same agent listed under two addresses
                    errors.append(f"scrape {target.address}: GPU {g.uuid} already reported by node {first.node}")
            if outcome.host is not None:
                hosts.append(outcome.host)
            alerts += outcome.alerts
        current = {tg.url for tg in targets}
        for url in [u for u in self._nodes if u not in current]:
            del self._nodes[url]  # forget targets that left file_sd
        return TelemetryBatch(t=t, gpus=tuple(gpus.values()), hosts=tuple(hosts),
                              absent_nodes=frozenset(absent), errors=tuple(errors),
                              alerts=tuple(alerts))

    def close(self) -> None:
        """Stop the worker threads and close the HTTP client if we made it."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._owns_client:
            self._client.close()

    def _targets(self, errors: list[str]) -> list[Target]:
        targets = list(self._static)
        if self._file_sd is not None:
            found, error = self._file_sd.current()
            if error:
                errors.append(error)
            known = {t.url for t in targets}
            targets += [t for t in found if t.url not in known]
        return targets

    def _scrape_safely(self, target: Target) -> AgentReading | str:
        try:
            return self._scrape(target)
        except Exception as e:  # noqa: BLE001 - one target's surprise must not fail the others
            return f"unexpected {type(e).__name__}: {one_line(e)}"

    def _scrape(self, target: Target) -> AgentReading | str:
        """The agent's reading, or one line saying why there is none."""
        try:
            status, body = get_bounded(self._client, target.url, headers=self._headers, timeout_s=self._timeout_s,
                                       max_bytes=self._max_body)
        except FetchError as e:
            return str(e)
        if status != 200:
            return f"HTTP {status}"
        t = self._clock()
        try:
            families = list(text_string_to_metric_families(wanted_lines(body.decode("utf-8"))))
        except Exception as e:  # noqa: BLE001 - the parser raises several types on garbage
            return f"unparsable exposition: {one_line(e)}"
        if not any(f.name.startswith("gpumond_") for f in families):
            return "no gpumond metrics in the exposition (is this a gpumond agent?)"
        return read_agent(families, t=t, fallback_node=target.host, node=target.node)
