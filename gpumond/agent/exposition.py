"""Render a Snapshot to Prometheus text once per cycle; scrapes are served from the cached bytes.

The encoder writes the same bytes as prometheus-client's `generate_latest` (a property test and the
golden file hold it to that) but caches each series' escaped `name{labels} ` prefix, which stays the same
from cycle to cycle: prometheus-client formats every label of every sample on every call, and that was
two thirds of a full sample cycle (benchmarks/results/agent_sample_cycle.md).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.utils import floatToGoString

from gpumond.agent.metrics import metric_types
from gpumond.agent.readings import Labels, Series, Snapshot

_MAX_CACHED = 100_000  # series identities; far above any node's, bounded so churn cannot grow memory


@dataclass(frozen=True, slots=True)
class Rendered:
    """The bytes one scrape returns, plain and gzip, and when they were made."""

    plain: bytes
    gzipped: bytes
    taken_at: float


def escape_label_value(v: str) -> str:
    """Exposition-format escaping of a label value (backslash, newline, double quote)."""
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _help_text(h: str) -> str:
    return h.replace("\\", "\\\\").replace("\n", "\\n")


class Renderer:
    """Turns snapshots into exposition bytes; keeps per-series prefixes and per-family headers."""

    def __init__(self, gzip_level: int = 1, types: dict[str, tuple[str, str]] | None = None) -> None:
        # gzip level 1: 2× faster than 6 for ~35 % more bytes (3.8 KB vs 2.8 KB per 8-GPU scrape).
        self._types = metric_types() if types is None else types
        self._gzip_level = gzip_level
        self._prefixes: dict[tuple[str, Labels], str] = {}
        self._headers: dict[str, str] = {}

    def _header(self, name: str) -> str:
        h = self._headers.get(name)
        if h is None:
            kind, help_ = self._types.get(name, ("gauge", ""))
            h = f"# HELP {name} {_help_text(help_)}\n# TYPE {name} {kind}\n"
            self._headers[name] = h
        return h

    def _prefix(self, name: str, labels: Labels) -> str:
        key = (name, labels)
        p = self._prefixes.get(key)
        if p is None:
            if labels:
                inner = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in sorted(labels))
                p = f"{name}{{{inner}}} "
            else:
                p = f"{name} "
            if len(self._prefixes) >= _MAX_CACHED:
                self._prefixes.clear()
            self._prefixes[key] = p
        return p

    def encode(self, series: Iterable[Series]) -> bytes:
        """Prometheus text format 0.0.4 for these series, grouped into families by name."""
        ordered = sorted(series, key=lambda s: s.name)  # stable: a family's samples keep their order
        out: list[str] = []
        last = None
        prefix = self._prefix
        for s in ordered:
            if s.name != last:
                out.append(self._header(s.name))
                last = s.name
            out.append(prefix(s.name, s.labels) + floatToGoString(s.value) + "\n")
        return "".join(out).encode("utf-8")

    def render(self, snapshot: Snapshot, extra: Iterable[Series] = ()) -> Rendered:
        """Encode every series of the snapshot (plus `extra`) once, plain and gzipped."""
        series = [s for r in snapshot.results for s in r.series]
        series.extend(extra)
        plain = self.encode(series)
        return Rendered(plain, gzip.compress(plain, self._gzip_level), snapshot.taken_at)
