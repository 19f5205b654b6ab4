"""Render a Snapshot to Prometheus text once per cycle; scrapes are served from the cached bytes."""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpumond.agent.metrics import metric_types
from gpumond.agent.readings import Series, Snapshot


@dataclass(frozen=True, slots=True)
class Rendered:
    """The bytes one scrape returns, plain and gzip, and when they were made."""

    plain: bytes
    gzipped: bytes
    taken_at: float


class _SnapshotCollector:
    """A prometheus-client collector over one immutable snapshot; never touches NVML."""

    def __init__(self, series: Iterable[Series], types: Mapping[str, tuple[str, str]]) -> None:
        self._series = series
        self._types = types

    def describe(self) -> list[Metric]:
        return []  # registering must not call collect()

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for s in self._series:
            fam = families.get(s.name)
            if fam is None:
                kind, help_ = self._types.get(s.name, ("gauge", ""))
                names = [k for k, _ in s.labels]
                if kind == "counter":
                    fam = CounterMetricFamily(s.name.removesuffix("_total"), help_, labels=names)
                else:
                    fam = GaugeMetricFamily(s.name, help_, labels=names)
                families[s.name] = fam
            fam.add_metric([v for _, v in s.labels], s.value)
        yield from families.values()


class Renderer:
    """Turns snapshots into exposition bytes with prometheus-client's own encoder."""

    def __init__(self, gzip_level: int = 6) -> None:
        self._types = metric_types()
        self._gzip_level = gzip_level

    def render(self, snapshot: Snapshot, extra: Iterable[Series] = ()) -> Rendered:
        """Encode every series of the snapshot (plus `extra`) once, plain and gzipped."""
        series = [s for r in snapshot.results for s in r.series]
        series.extend(extra)
        series.sort(key=lambda s: s.name)  # a family must be contiguous in the output
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_SnapshotCollector(series, self._types))  # type: ignore[arg-type]
        plain = generate_latest(registry)
        return Rendered(plain, gzip.compress(plain, self._gzip_level), snapshot.taken_at)
