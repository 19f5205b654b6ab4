"""Real Alertmanager replicas and a real `gpumond rules` process on 127.0.0.1, for the alert delivery tests."""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.integration.helpers import (
    LOOPBACK,
    START_TIMEOUT_S,
    ManagedProcess,
    free_port,
    http_get,
    require_binary,
    wait_until,
    write_yaml,
)

TOKEN = "alert-test-token-0123456789"


class Alertmanager(ManagedProcess):
    """`prometheus-alertmanager` on loopback with `config`: alone (gossip off), or gossiping with `peers`."""

    label = "alertmanager"
    ready_path = "/-/ready"

    def __init__(self, workdir: Path, config: Path, *, cluster_port: int | None = None,
                 peers: Sequence[int] = (), web_config: Path | None = None, tls: ssl.SSLContext | None = None,
                 headers: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.tls = tls  # with a web config that serves TLS: how the test reaches it, and its credentials
        self.headers = headers or {}
        argv = [require_binary("prometheus-alertmanager"), f"--config.file={config}",
                f"--storage.path={workdir / 'data'}", f"--web.listen-address={LOOPBACK}:{self.port}",
                f"--web.external-url={'https' if tls else 'http'}://{LOOPBACK}:{self.port}", "--log.level=warn"]
        if web_config is not None:
            argv.append(f"--web.config.file={web_config}")
        if cluster_port is None:
            argv.append("--cluster.listen-address=")
        else:
            argv += [f"--cluster.listen-address={LOOPBACK}:{cluster_port}",
                     f"--cluster.advertise-address={LOOPBACK}:{cluster_port}", "--cluster.peer-timeout=3s",
                     "--cluster.gossip-interval=100ms", "--cluster.pushpull-interval=1s",
                     *(f"--cluster.peer={LOOPBACK}:{p}" for p in peers)]
        super().__init__(argv, workdir)

    def ready(self) -> bool:
        return http_get(f"{self.base_url}{self.ready_path}", self.headers, timeout=1.0, context=self.tls)[0] == 200

    def get(self, path: str) -> Any:
        status, _, body = http_get(f"{self.url}{path}", self.headers, context=self.tls)
        assert status == 200, body[:500]
        return json.loads(body)

    def alerts(self) -> list[dict[str, Any]]:
        return self.get("/api/v2/alerts")

    def post_alerts(self, alerts: list[dict[str, Any]]) -> None:
        r = httpx.post(f"{self.url}/api/v2/alerts", json=alerts, timeout=5.0, trust_env=False)
        assert r.status_code == 200, r.status_code

    def peers(self) -> int:
        return len(self.get("/api/v2/status").get("cluster", {}).get("peers") or [])


def alertmanager_cluster(workdir: Path, webhook_url: str, replicas: int = 2) -> list[Alertmanager]:
    """Replicas that gossip with each other (so a group is notified once, by one of them)."""
    config = write_yaml(workdir / "alertmanager.yml", {
        "route": {"receiver": "hook", "group_by": ["alertname", "node", "job"], "group_wait": "1s",
                  "group_interval": "2s", "repeat_interval": "1h"},
        "receivers": [{"name": "hook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
    })
    ports = [free_port() for _ in range(replicas)]
    ams = [Alertmanager(workdir / f"am{i}", config, cluster_port=ports[i],
                        peers=[p for j, p in enumerate(ports) if j != i]) for i in range(replicas)]
    for am in ams:
        am.start()
    wait_until(lambda: all(am.peers() == replicas for am in ams), timeout=20, what="alertmanager cluster formed")
    return ams


class RulesDaemon(ManagedProcess):
    """`python -m gpumond.cli rules` on loopback with the given config (listen added), started until /healthz."""

    label = "rules"

    def __init__(self, workdir: Path, config: dict[str, Any], *, port: int | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.port = port or free_port()
        self.tls = tls  # how the test reaches a service serving https (its web_config_file)
        path = write_yaml(workdir / "rules.yaml", {"listen": f"{LOOPBACK}:{self.port}", **config})
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("GPUMOND_RULES_TOKENS", None)
        super().__init__([sys.executable, "-m", "gpumond.cli", "rules", "--config", str(path)], workdir, env=env)


class RulesProcess(RulesDaemon):
    """The rules service with no telemetry source and alert sinks; findings come from pushes."""

    def __init__(self, workdir: Path, alerting: dict[str, Any], *, state_dir: Path, port: int | None = None,
                 evaluation_interval_s: float = 0.5, shard: str | None = None) -> None:
        super().__init__(workdir, {
            "tokens": [TOKEN], "evaluation_interval_s": evaluation_interval_s,
            # Fire and resolve as fast as the old "2 of 3 / 3 quiet" at this interval: these tests are about
            # delivery, not about telling transients from stragglers.
            "findings": {"min_duration_s": evaluation_interval_s, "resolve_after_s": 3 * evaluation_interval_s},
            "state_dir": str(state_dir), "alerting": alerting, "log": {"format": "json"},
            **({"shard": shard} if shard is not None else {})}, port=port)

    def push_job(self, job: str, *, ranks: int, steps: int, data_wait_s: float, first_step: int = 0) -> None:
        """`steps` recent steps of 0.5 s for every rank, each waiting `data_wait_s` on its data loader."""
        now = time.time()
        for rank in range(ranks):
            body = {"job": job, "rank": rank, "world_size": ranks, "node": f"node-{rank // 8}",
                    "gpu_uuid": f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{job}/{rank}')}",
                    "steps": [{"step": first_step + i, "end": now - (steps - i) * 0.5, "duration_s": 0.5,
                               "data_wait_s": data_wait_s} for i in range(steps)]}
            r = httpx.post(f"{self.url}/api/v1/push", json=body, headers={"Authorization": f"Bearer {TOKEN}"},
                           timeout=5.0)
            assert r.status_code == 202, r.text

    def alerts(self) -> list[dict[str, Any]]:
        return json.loads(httpx.get(f"{self.url}/api/v1/alerts", timeout=5.0).content)["alerts"]
