"""Integration helpers for the rules service: a real VictoriaMetrics, and several agents started at once.

    with running_agents({"node-a": 4, "node-b": 4}, tmp_path) as agents:      # spawned together, all healthy
        with VictoriaMetricsServer([a.address for a in agents.values()], tmp_path / "vm") as vm:
            vm.wait_for("count(gpumond_gpu_up)", lambda r: scalar(r) == 8, timeout=20)

VictoriaMetrics scrapes with its built-in promscrape (`-promscrape.config`, Prometheus' scrape_configs
syntax), so no remote-write pipeline is involved. Everything listens on 127.0.0.1, every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import (
    LOOPBACK,
    START_TIMEOUT_S,
    AgentProcess,
    ManagedProcess,
    PrometheusServer,
    free_port,
    http_get,
    write_yaml,
)


@contextlib.contextmanager
def running_agents(gpus_by_node: Mapping[str, int], workdir: Path, extra_args: Sequence[str | Path] = (),
                   timeout: float = START_TIMEOUT_S) -> Iterator[dict[str, AgentProcess]]:
    """`gpumond agent --sim N --node-name NODE EXTRA…` for each entry, spawned together; all stopped at exit."""
    agents = {node: AgentProcess(["--sim", str(n), "--node-name", node, *extra_args], workdir / node)
              for node, n in gpus_by_node.items()}
    try:
        for agent in agents.values():
            agent.spawn()  # start them all before waiting: startup overlaps
        for agent in agents.values():
            agent.wait_ready(timeout)
        yield agents
    finally:
        for agent in agents.values():
            if agent.proc is not None:
                agent.stop()


class VictoriaMetricsServer(ManagedProcess):
    """Single-node VictoriaMetrics on 127.0.0.1:<free port> scraping `targets` every `scrape_interval`."""

    label = "victoria-metrics"
    ready_path = "/health"

    def __init__(self, targets: Sequence[str], workdir: Path, *, job: str = "gpumond",
                 port: int | None = None, scrape_interval: str = "1s") -> None:
        binary = shutil.which("victoria-metrics")
        if binary is None:  # FAIL, never skip: CI installs it
            pytest.fail("'victoria-metrics' is not installed (not on PATH); run `bash scripts/test.sh` or "
                        "`apt-get install victoria-metrics`", pytrace=False)
        for t in targets:
            assert t.startswith(f"{LOOPBACK}:"), f"scrape targets must be on {LOOPBACK}, got {t!r}"
        self.port = port if port is not None else free_port()
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = write_yaml(workdir / "prometheus.yml", {
            "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval},
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets)}]}],
        })
        super().__init__([binary, f"-httpListenAddr={LOOPBACK}:{self.port}",
                          f"-storageDataPath={workdir / 'data'}",
                          f"-promscrape.config={self.config_path}"], workdir)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query at now → the result list (nocache=1, or VictoriaMetrics answers for 30 s ago)."""
        url = f"{self.base_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql, "nocache": "1"})
        status, _, body = http_get(url)
        payload = json.loads(body)
        assert status == 200 and payload.get("status") == "success", \
            f"query {promql!r} failed ({status}): {body[:500]!r}"
        return list(payload["data"]["result"])

    wait_for = PrometheusServer.wait_for  # the same polling over this server's query()
