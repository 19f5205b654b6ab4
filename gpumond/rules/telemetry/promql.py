"""Telemetry from a Prometheus-compatible query API (Prometheus, VictoriaMetrics, Thanos, Mimir) at fleet scale."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx

from gpumond import __version__
from gpumond.rules.telemetry import signals
from gpumond.web.client import Access, AccessError, http_client
from gpumond.web.bounded import FetchError, get_bounded
from gpumond.rules.telemetry.promql_join import IDENTITY, TARGETS, Row, agent_alerts, join
from gpumond.rules.telemetry import promql_need as need_of
from gpumond.rules.telemetry.promql_need import Cadence
from gpumond.rules.telemetry.promql_tiers import REUSED, Tiers, throttle_rows, up_of
from gpumond.rules.types import TelemetryBatch, TelemetryNeed
from gpumond.wire.safetext import one_line

DEFAULT_TIMEOUT_S = 10.0
# Prometheus' default lookback delta: a target gone longer than this is forgotten rather than absent.
DEFAULT_LOOKBACK_S = 300.0
DEFAULT_MAX_WORKERS = 4
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
# How long what changes rarely (identity, MIG devices, max clock, power limit, which throttle reasons exist) is
# reused before it is asked in full again (promql_tiers): every 4th fetch at the default 15 s interval_s.
DEFAULT_REFRESH_S = 60.0
# How often every needed GPU's values are asked when a fetch is given a TelemetryNeed (promql_need); in between,
# only the suspects'. 0: every fetch.
DEFAULT_DETAIL_S = 0.0

try:  # Optional fast path (the `fast` extra): decodes a fetch's answers ~1.5× faster than json; same results.
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - the stdlib is the reference
    _fast_loads = None
DEFAULT_LOADS: Callable[[bytes], object] = _fast_loads or json.loads


def build_queries(lookback_s: float, where: str = "") -> dict[str, str]:
    """The instant queries one fetch runs, keyed as promql_join.join expects: one per metric name.

    `where`, a label matcher (`instance=~"…"`), narrows every query about GPUs and hosts to the targets it matches
    (promql_need); the identity, `up` and the agents' alerts are always asked of the whole fleet."""
    info = f"last_over_time({signals.INFO}[{max(1, round(lookback_s))}s])"
    return {
        IDENTITY: info,
        # `up` of gpumond targets only: a large Prometheus has many other targets we do not care about.
        TARGETS: f"up and on (job, instance) {info}",
        signals.GPU_UP: signals.selector(signals.GPU_UP, where),
        signals.JOB_INFO: signals.selector(signals.JOB_INFO, where),
        signals.MIG_INFO: signals.selector(signals.MIG_INFO, where),
        # The agents' firing alerts (they carry `gpu`; the rules services' own do not): fleet remediation's input.
        signals.ALERT_ACTIVE: f'{signals.ALERT_ACTIVE}{{gpu!=""}}',
        **{metric: _lean(metric, selector) for metric, selector in signals.gpu_selectors(where).items()},
        # The throttle reasons as one series per GPU: asked first, the per-reason series only where it is missing.
        signals.CLOCKS_EVENT_MASK: _lean(signals.CLOCKS_EVENT_MASK,
                                         signals.selector(signals.CLOCKS_EVENT_MASK, where)),
        **{metric: signals.selector(metric, where) for metric in signals.HOST_SERIES.values()},
    }


def _lean(metric: str, selector: str) -> str:
    """A GPU value query that answers with only the labels the join reads: the uuid (and the selecting label).

    At fleet scale these answers are most of a fetch (a series' job, instance, gpu and name are ~75 % of its
    JSON); the aggregation is plain PromQL, so every Prometheus-compatible server runs it. The agent exports
    one series per GPU and label value (MIG devices' series have names of their own), so `max` only picks
    between duplicates (two jobs scraping one agent), where the join took either. The NVLink counters are one
    series per link: kept whole, as the join has always read them."""
    if metric == signals.NVLINK_ERRORS:
        return selector
    label = signals.SELECTOR_LABEL.get(metric)
    return f"max by (uuid{', ' + label if label else ''}) ({selector})"


class PrometheusSource:
    """Instant queries against /api/v1/query, joined by GPU uuid; failures land in `errors`, never raised."""

    name = "prometheus"

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S, client: httpx.Client | None = None,
                 clock: Callable[[], float] = time.time, lookback_s: float = DEFAULT_LOOKBACK_S,
                 max_workers: int = DEFAULT_MAX_WORKERS, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 access: Access | None = None, loads: Callable[[bytes], object] = DEFAULT_LOADS,
                 refresh_s: float = DEFAULT_REFRESH_S, detail_s: float = DEFAULT_DETAIL_S) -> None:
        if timeout_s <= 0 or lookback_s <= 0 or max_workers < 1 or max_body_bytes < 1:
            raise ValueError("timeout_s, lookback_s, max_workers and max_body_bytes must be positive")
        # `url` is the API root, the part before /api/v1/query: http://prometheus:9090,
        # http://mimir/prometheus, http://vmselect:8481/select/0/prometheus (VictoriaMetrics cluster).
        self.url = url.rstrip("/")
        self._endpoint = f"{self.url}/api/v1/query"
        self._timeout_s = float(timeout_s)
        self._max_body = max_body_bytes
        self._clock = clock
        self._lookback_s = lookback_s
        self._queries = build_queries(lookback_s)
        self._tiers = Tiers(self._queries, refresh_s)
        self._cadence = Cadence(detail_s)
        self._loads = loads
        self._owns_client = client is None
        self._access = access if access is not None else Access()
        self._headers: dict[str, str] = {}
        # trust_env: a Prometheus-compatible API across the network may sit behind the environment's proxy.
        self._client = client or http_client(self._access, headers={"User-Agent": f"gpumond-rules/{__version__}"},
                                             trust_env=True)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="gpumond-promql")

    def fetch(self, need: TelemetryNeed | None = None) -> TelemetryBatch:
        """Run this fetch's queries at one evaluation time and join the answers: what promql_tiers plans, narrowed
        to what `need` asks for and at the cadences promql_need describes (None: everything, every fetch)."""
        t = self._clock()
        errors: list[str] = []
        if problem := self._access.refresh():
            errors.append(f"prometheus: changed certificate files not used: {problem}")
        try:
            self._headers = self._access.headers()
        except AccessError as e:  # the previous credentials are tried; the error says why they may fail
            errors.append(f"prometheus: {e}")
        identity = self._tiers.kept(IDENTITY)
        if not self._cadence.due(t, need, identity):
            assert need is not None and identity is not None
            return self._between(t, need, identity, errors)
        asked = self._tiers.plan(t)
        where = None if need is None else need_of.selection(identity, need.gpus | need.suspects)
        sent = need_of.narrowed(asked, self._queries, None if where is None else self._narrow(where))
        answered = self._run(sent, t, errors)
        results = self._tiers.merge(asked, answered, t)
        if IDENTITY not in results or signals.GPU_UP not in results:
            # Without identities and liveness nothing can be said about any node, least of all that it is absent.
            # (Nor is a detail fetch done: the next fetch is one again.)
            return TelemetryBatch(t=t, errors=tuple(errors))
        joined = join(results, t=t)
        if need is not None:
            self._cadence.detailed(t, joined)
        return TelemetryBatch(t=t, gpus=joined.gpus, hosts=joined.hosts, absent_nodes=joined.absent_nodes,
                              errors=tuple(errors), alerts=agent_alerts(results.get(signals.ALERT_ACTIVE, ())),
                              alerts_known=signals.ALERT_ACTIVE in results)

    def _between(self, t: float, need: TelemetryNeed, identity: Sequence[Row], errors: list[str]) -> TelemetryBatch:
        """A fetch between detail fetches: `up` and the alerts of the fleet, the suspects' targets in full, everyone
        else's last sample passed on (promql_need)."""
        sent = {TARGETS: up_of(identity), signals.ALERT_ACTIVE: self._queries[signals.ALERT_ACTIVE]}
        where = need_of.selection(identity, need.suspects) if need.suspects else ""
        if where is None:  # suspects on most of the fleet: everyone's detail is asked as often as theirs
            self._cadence.forget()
            return self.fetch(need)
        if where:
            sent |= need_of.suspect_queries(self._narrow(where))
        answered = self._run(sent, t, errors)
        # What changes rarely is the last refresh's, as a fetch of everything between refreshes reads it: of the
        # suspects' targets' GPUs only (the others are passed on).
        theirs = need_of.uuids_on(identity, need_of.targets_of(identity, need.suspects)) if where else frozenset()
        results: dict[str, Sequence[Row]] = {k: [r for r in rows if r.labels.get("uuid") in theirs]
                                             for k in REUSED if (rows := self._tiers.kept(k)) is not None}
        results |= answered
        results[IDENTITY] = identity
        results.setdefault(signals.GPU_UP, ())
        throttle = (signals.CLOCKS_EVENT_MASK, signals.CLOCKS_EVENT)
        if all(k in answered for k in throttle):
            results[signals.CLOCKS_EVENT] = throttle_rows(answered[throttle[0]], answered[throttle[1]])[0]
        else:  # a failed throttle query: the signals are missing, never half-read
            results.pop(signals.CLOCKS_EVENT, None)
        results.pop(signals.CLOCKS_EVENT_MASK, None)
        joined = join(results, t=t)
        gpus, hosts = self._cadence.between(joined)
        return TelemetryBatch(t=t, gpus=gpus, hosts=hosts, absent_nodes=joined.absent_nodes, errors=tuple(errors),
                              alerts=agent_alerts(results.get(signals.ALERT_ACTIVE, ())),
                              alerts_known=signals.ALERT_ACTIVE in results)

    def _narrow(self, where: str) -> dict[str, str]:
        """build_queries with `where` added to every GPU and host selector; "" asks none of them."""
        return build_queries(self._lookback_s, where) if where else {}

    def _run(self, sent: Mapping[str, str], t: float, errors: list[str]) -> dict[str, list[Row]]:
        """Each query's rows by key, all at the instant `t`, on the worker pool; a failed one is an error line."""
        futures = {key: self._pool.submit(self._query_safely, q, t) for key, q in sent.items()}
        answered: dict[str, list[Row]] = {}
        for key, future in futures.items():
            outcome = future.result()
            if isinstance(outcome, str):
                errors.append(f"prometheus {sent[key]}: {outcome}")
            else:
                answered[key] = outcome
        return answered

    def close(self) -> None:
        """Stop the worker threads and close the HTTP client if we made it."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._owns_client:
            self._client.close()

    def _query_safely(self, promql: str, t: float) -> list[Row] | str:
        try:
            return self._query(promql, t)
        except Exception as e:  # noqa: BLE001 - one query's surprise must not fail the fetch
            return f"unexpected {type(e).__name__}: {one_line(e)}"

    def _query(self, promql: str, t: float) -> list[Row] | str:
        """The rows of one instant vector, or one line saying why there are none."""
        params = {
            "query": promql,
            "time": f"{t:.3f}",  # every query of a fetch evaluates at the same instant
            "timeout": f"{self._timeout_s:g}s",  # the server gives up too, rather than work for nobody
            # VictoriaMetrics otherwise moves an instant query near "now" back by -search.latencyOffset (30 s);
            # Prometheus, Thanos and Mimir ignore the parameter.
            "nocache": "1",
        }
        try:
            status, body = get_bounded(self._client, self._endpoint, params=params, timeout_s=self._timeout_s,
                                       max_bytes=self._max_body, headers=self._headers)
        except FetchError as e:
            return str(e)
        return vector_rows(status, body, self._loads)


def vector_rows(status: int, body: bytes, loads: Callable[[bytes], object] = json.loads) -> list[Row] | str:
    """The rows of an /api/v1/query answer that is an instant vector, or one line saying why there are none."""
    try:
        payload = loads(body)
    except ValueError:
        return f"HTTP {status}: response is not JSON: {one_line(body[:200].decode('utf-8', 'replace'))}"
    if not isinstance(payload, dict):
        return f"HTTP {status}: response is not a JSON object"
    if status != 200 or payload.get("status") != "success":
        return one_line(f"HTTP {status}: {payload.get('errorType', 'error')}: {payload.get('error', '')}")
    data = payload.get("data") or {}
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        return f"expected an instant vector, got {data.get('resultType') if isinstance(data, dict) else data!r}"
    try:
        # One pass, no copy of each series' labels (the decoder made them for us); at 33,000 GPUs × ~15
        # queries a fetch decodes ~500,000 series, and every per-series step here is visible in its time.
        rows = [Row(m if type(m) is dict else _labels(m), v) for item in data["result"]
                if math.isfinite(v := float(item["value"][1])) for m in (item["metric"],)]  # NaN / Inf: no reading
    except (KeyError, IndexError, TypeError, ValueError) as e:
        return f"malformed result: {type(e).__name__}: {one_line(e)}"
    return rows


def _labels(metric: object) -> dict[str, str]:
    # Not a JSON object: as dict() would take it, or the TypeError / ValueError that reports the answer malformed.
    return dict(metric)  # type: ignore[call-overload]
