"""Prometheus text format (0.0.4) encoding shared by both daemons.

Writes the same bytes as prometheus-client's `generate_latest` (held to that by a property test and the
agent's golden file) but caches each series' escaped `name{labels} ` prefix, which stays the same from one
cycle to the next: prometheus-client formats every label of every sample on every call, and that was two
thirds of the agent's sample cycle (benchmarks/results/agent_sample_cycle.md).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping

from prometheus_client.utils import floatToGoString

from gpumond.types import Labels, Series
from gpumond.wire.safetext import UNSAFE

log = logging.getLogger("gpumond")
_MAX_CACHED = 100_000  # series identities; far above any node's, bounded so churn cannot grow memory


def escape_label_value(v: str) -> str:
    """Exposition-format escaping of a label value (backslash, newline, double quote, unsafe characters).

    Beyond what prometheus-client escapes, the characters of gpumond.wire.safetext (other controls, U+2028/9,
    bidi controls) are written as a literal `\\uXXXX` (an escaped backslash), so a reader of /metrics sees
    their code instead of a split line or reordered text.
    """
    out = v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return UNSAFE.sub(_escaped_code, out) if UNSAFE.search(out) else out


def _escaped_code(m: re.Match[str]) -> str:
    return f"\\\\u{ord(m.group()):04x}"


def _help_text(h: str) -> str:
    return h.replace("\\", "\\\\").replace("\n", "\\n")


class Encoder:
    """Series → exposition bytes; `types` maps a metric name to (type, help)."""

    def __init__(self, types: Mapping[str, tuple[str, str]]) -> None:
        self._types = types
        self._prefixes: dict[tuple[str, Labels], str] = {}
        self._headers: dict[str, str] = {}
        self.undeclared: set[str] = set()  # names seen without a declaration (logged once each, left out)

    def _header(self, name: str) -> str | None:
        """The HELP and TYPE lines of a family; None for a name not declared in `types`."""
        h = self._headers.get(name)
        if h is None:
            declared = self._types.get(name)
            if declared is None:
                # A bug (a source emitting a name nobody declared), not a reason to fail the scrape; but an
                # untyped series with an empty HELP is not exported silently either.
                if name not in self.undeclared:
                    self.undeclared.add(name)
                    log.error("series not exported: its metric is not declared", extra={"metric": name})
                return None
            h = f"# HELP {name} {_help_text(declared[1])}\n# TYPE {name} {declared[0]}\n"
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
        header: str | None = None
        for s in ordered:
            if s.name != last:
                header = self._header(s.name)
                if header is not None:
                    out.append(header)
                last = s.name
            if header is not None:
                out.append(prefix(s.name, s.labels) + floatToGoString(s.value) + "\n")
        return "".join(out).encode("utf-8")
