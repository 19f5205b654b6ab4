"""Alert sinks, one file each; `build_sinks` is the one place a sink is registered."""

from __future__ import annotations

import time
from collections.abc import Callable

from gpumond.alerts.sinks.alertmanager import AlertmanagerSink
from gpumond.alerts.sinks.base import SINK_METRICS, Sink, Snapshot
from gpumond.alerts.sinks.log import LogSink
from gpumond.alerts.sinks.pagerduty import PagerDutySink
from gpumond.alerts.sinks.slack import SlackSink
from gpumond.alerts.state import AlertStateFile
from gpumond.config.alerting import AlertingConfig

__all__ = ["SINK_METRICS", "AlertmanagerSink", "LogSink", "PagerDutySink", "Sink", "SlackSink", "Snapshot",
           "build_sinks"]


def build_sinks(cfg: AlertingConfig, state: AlertStateFile, *, evaluation_interval_s: float,
                clock: Callable[[], float] = time.time) -> list[Sink]:
    """The log sink, then every sink `cfg` turns on (secrets already resolved by the config loader). AccessError
    (gpumond.web.client; one line naming the key) when a certificate or secret file of a sink cannot be used."""
    sinks: list[Sink] = [LogSink()]
    if cfg.alertmanager is not None:
        sinks += [AlertmanagerSink(url, cfg.alertmanager, evaluation_interval_s=evaluation_interval_s,
                                   queue_size=cfg.queue_size, clock=clock) for url in cfg.alertmanager.urls]
    if cfg.slack is not None:
        sinks.append(SlackSink(cfg.slack, book=state.book("slack"), queue_size=cfg.queue_size, clock=clock))
    if cfg.pagerduty is not None:
        sinks.append(PagerDutySink(cfg.pagerduty, book=state.book("pagerduty"), queue_size=cfg.queue_size,
                                   clock=clock))
    return sinks
