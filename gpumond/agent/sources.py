"""Per-source isolation: run one source, time it, and turn any failure into a reported result."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from gpumond.agent.readings import Series, SourceResult

log = logging.getLogger("gpumond.agent")


class PartialFailure(RuntimeError):
    """A source failed but still has series worth exporting (e.g. gpu_up 0 while NVML is down)."""

    def __init__(self, message: str, series: Iterable[Series]) -> None:
        super().__init__(message)
        self.series = tuple(series)


def run_source(name: str, produce: Callable[[], Iterable[Series]],
               timer: Callable[[], float] = time.perf_counter) -> SourceResult:
    """Run `produce`; an exception fails only this source (prometheus-client would fail the whole scrape)."""
    start = timer()
    try:
        series = tuple(produce())
    except PartialFailure as e:
        return SourceResult(name, False, timer() - start, e.series, str(e))
    except Exception as e:
        log.warning("collector failed", extra={"collector": name, "error": repr(e)})
        return SourceResult(name, False, timer() - start, (), repr(e))
    return SourceResult(name, True, timer() - start, series)


def self_series(results: Iterable[SourceResult]) -> list[Series]:
    """gpumond_collector_success / _duration_seconds for each source."""
    out = []
    for r in results:
        labels = (("collector", r.source),)
        out.append(Series("gpumond_collector_success", labels, 1.0 if r.ok else 0.0))
        out.append(Series("gpumond_collector_duration_seconds", labels, r.duration_s))
    return out
