"""gpumond's training-job SDK: per-step time, data-loader and peer waits, pushed to the rules service (stdlib only).

    import gpumond.job
    for batch in gpumond.job.wrap(loader):   # a step is the span between consecutive fetches
        train(batch)
        with gpumond.job.comm_wait():        # optional: time spent waiting for the other ranks
            all_reduce_loss()

Configured by `init(**kwargs)` or the environment (GPUMOND_ENDPOINT, GPUMOND_TOKEN, …); a
misconfigured reporter logs one warning on the "gpumond.job" logger and does nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from gpumond.job.reporter import Reporter
from gpumond.job.settings import Identity
from gpumond.job.stats import Stats

__all__ = ["Identity", "Reporter", "Stats", "close", "comm_wait", "get_reporter", "init", "step", "step_end",
           "wrap"]

T = TypeVar("T")
_lock = threading.Lock()
_default: Reporter | None = None


def init(**kwargs: Any) -> Reporter:
    """Create the default reporter from `kwargs` (as Reporter takes them), closing any previous one."""
    global _default
    with _lock:
        previous, _default = _default, Reporter(**kwargs)
        current = _default
    if previous is not None:
        previous.close()
    return current


def get_reporter() -> Reporter:
    """The default reporter, created from the environment on first use."""
    global _default
    with _lock:
        if _default is None:
            _default = Reporter()
        return _default


def wrap(iterable: Iterable[T]) -> Iterator[T]:
    """`get_reporter().wrap(iterable)`."""
    return get_reporter().wrap(iterable)


def step_end(samples: int | None = None, step: int | None = None, comm_wait_s: float | None = None) -> None:
    """`get_reporter().step_end(...)`."""
    get_reporter().step_end(samples, step, comm_wait_s)


def step(samples: int | None = None) -> Any:
    """`with gpumond.job.step():` on the default reporter."""
    return get_reporter().step(samples)


def comm_wait() -> Any:
    """`with gpumond.job.comm_wait():` on the default reporter."""
    return get_reporter().comm_wait()


def close(timeout_s: float = 5.0) -> None:
    """Flush and stop the default reporter, if there is one (atexit does this too)."""
    with _lock:
        rep = _default
    if rep is not None:
        rep.close(timeout_s)
