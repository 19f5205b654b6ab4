"""Every query of the three dashboards runs on a real Prometheus scraping a faulty simulated cluster.

Two agents (8 simulated GPUs each, physics at SPEED×) with planted faults, the rules service (in this
process, as `gpumond demo` runs it) scraping them and fed by a simulated 14-rank training job through the
real job SDK, and one Prometheus scraping agents and rules service with a `cluster` target label:

  dash-node-a GPU 1  loses its cooling: thermal slowdown, the policy caps its power, its rank straggles
  dash-node-a GPU 6  XID 48 with an uncorrected ECC error (a pending row remap)
  dash-node-a GPU 7  falls off the bus after Prometheus has seen it
  dash-node-b GPU 5  its rank's data loader stalls: low utilization, an I/O-starved rank

Each variable query is answered as Grafana does (labels API), the variables are substituted as Grafana's
Prometheus data source does ("All" selected), and every panel target and annotation query must parse and
return data: a panel empty on a cluster with these faults is a defect.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards.build import OUT as DASHBOARDS
from gpumond.demo.cluster import RulesProcess
from gpumond.demo.job import ClockFactors, SimulatedJob
from tests.integration.grafana_queries import interpolate, query_range, variable_values
from tests.integration.helpers import (
    LOOPBACK,
    AgentProcess,
    PrometheusServer,
    follow_clocks,
    samples,
    scalar,
    write_yaml,
)

pytestmark = pytest.mark.integration

SPEED = 4.0
CLUSTER = "dash-test"
JOB = "dash-job"
NODES = ("dash-node-a", "dash-node-b")
HOT, XID_GPU, LOST, STARVED = ("dash-node-a", 1), ("dash-node-a", 6), ("dash-node-a", 7), ("dash-node-b", 5)
BAD_LINK = ("dash-node-b", 2)
FAULTS = {
    # Cooling fails 10 s (wall) in, after Prometheus's first scrapes: the policy's cuts are then on record.
    "dash-node-a": [{"gpu": 1, "kind": "cooling", "factor": 2.5, "at_s": 40},
                    {"gpu": 6, "kind": "xid", "code": 48, "at_s": 8},
                    {"gpu": 6, "kind": "ecc_uncorrected", "count": 1, "at_s": 8},
                    {"gpu": 7, "kind": "lost", "at_s": 60}],  # 15 s wall: after Prometheus's first scrapes
    "dash-node-b": [{"gpu": 5, "kind": "load", "pattern": "constant", "utilization": 0.6, "at_s": 0},
                    {"gpu": 2, "kind": "nvlink_degraded", "link": 5, "rate": 500, "at_s": 0}],
}
STEP_S = 0.25
DATA_WAIT_S = 0.15  # the starved rank waits ~40 % of each step on its loader
WAIT_S = 150.0


@dataclass
class Cluster:
    prom: PrometheusServer
    agents: dict[str, AgentProcess]
    started: float  # unix s: the dashboards open on "last 1 hour", which covers the whole run


def http_post(url: str) -> tuple[int, dict[str, str], bytes]:
    """POST with an empty body (Prometheus's /-/reload), loopback only."""
    assert url.startswith(f"http://{LOOPBACK}:")
    req = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, dict(resp.headers), resp.read()


def _scrape_config(job: str, targets: list[str]) -> dict[str, Any]:
    return {"job_name": job, "static_configs": [{"targets": targets, "labels": {"cluster": CLUSTER}}]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("dashboards")
    agents: dict[str, AgentProcess] = {}
    for node in NODES:
        d = work / node
        scenario = write_yaml(d / "scenario.yaml", {"default_load": {"pattern": "constant", "utilization": 0.97},
                                                    "faults": FAULTS[node]})
        config = write_yaml(d / "agent.yaml", {"state_dir": str(d / "state"),
                                               "sampling": {"fast_interval_s": 1, "slow_interval_s": 2},
                                               "policy": {"mode": "enforce", "thermal": {"step_w": 100,
                                                                                       "interval_s": 2}}})
        agents[node] = AgentProcess(["--sim", "8", "--node-name", node, "--sim-scenario", scenario,
                                     "--sim-speed", str(SPEED), "--config", config], d)
    rules = job = None
    stop = threading.Event()
    prom: PrometheusServer | None = None
    try:
        started = time.time()
        agent_scrape = _scrape_config("gpumond-agent", [a.address for a in agents.values()])
        prom = PrometheusServer([], work / "prometheus", extra_scrape_configs=[agent_scrape]).start()
        for a in agents.values():
            a.spawn()
        for a in agents.values():
            a.wait_ready()
        token = secrets.token_hex(16)
        rules = RulesProcess(list(agents.values()), token, work)  # type: ignore[arg-type]
        rules.wait_ready(time.monotonic() + 30)
        # The rules service's port is known only now: add it to the running Prometheus's config and reload.
        config = yaml.safe_load(prom.config_path.read_text())
        config["scrape_configs"].append(_scrape_config("gpumond-rules", [rules.url.removeprefix("http://")]))
        write_yaml(prom.config_path, config)
        status, _, body = http_post(f"{prom.base_url}/-/reload")
        assert status == 200, body

        uuids = {node: {s.labels["gpu"]: s.labels["uuid"] for s in samples(a.metrics(), "gpumond_gpu_info")}
                 for node, a in agents.items()}
        ranks = [(node, g, uuids[node][str(g)]) for node in NODES for g in range(8)
                 if (node, g) not in (XID_GPU, LOST)]
        starved_rank = ranks.index((*STARVED, uuids[STARVED[0]][str(STARVED[1])]))
        factors = ClockFactors()

        follow_clocks(agents, factors, stop, "dash-clocks")
        job = SimulatedJob(job=JOB, ranks=ranks, endpoint=rules.url, token=token, step_s=STEP_S,
                           clock_factors=factors, data_wait=lambda r: DATA_WAIT_S if r == starved_rank else 0.0)
        job.start()
        for kind in ("straggler", "io_starved_rank"):
            prom.wait_for(f'gpumond_finding{{kind="{kind}"}}', timeout=WAIT_S,
                          what=f"Prometheus to store a firing {kind} finding of the rules service")
        prom.wait_for("count(gpumond_gpu_up == 0)", lambda r: scalar(r) == 1, timeout=WAIT_S,
                      what="the lost GPU as gpumond_gpu_up 0")
        yield Cluster(prom, agents, started)
    finally:
        stop.set()
        if job is not None:
            job.stop()
        if rules is not None:
            rules.stop()
        for proc in (prom, *agents.values()):
            if proc is not None and proc.proc is not None:
                proc.stop()


def _choose(prom: PrometheusServer, variables: list[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """Each variable's value as Grafana would set it on load ("All" where offered), and the empty ones."""
    chosen: dict[str, Any] = {}
    empty = []
    for v in variables:
        if v["type"] == "datasource":
            continue
        if v["type"] == "constant":
            chosen[v["name"]] = v["query"]
            continue
        options = variable_values(prom, interpolate(v["query"], chosen))
        if not options:
            empty.append(f"${v['name']}: {v['query']}")
        if v.get("includeAll"):
            chosen[v["name"]] = v["allValue"] if v.get("allValue") else options
        else:
            chosen[v["name"]] = options[:1]
    return chosen, empty


def _queries(d: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(where, expr, instant) for every panel target and annotation of a dashboard."""
    out = [(f"panel {p['title']!r} {t['refId']}", t["expr"], bool(t.get("instant")))
           for p in d["panels"] for t in p["targets"]]
    out += [(f"annotation {a['name']!r}", a["target"]["expr"], False)
            for a in d["annotations"]["list"] if "target" in a]
    return out


@pytest.mark.parametrize("path", sorted(DASHBOARDS.glob("*.json")), ids=lambda p: p.stem)
def test_every_variable_panel_and_annotation_query_returns_data(cluster: Cluster, path: Path) -> None:
    d = json.loads(path.read_text())
    chosen, empty_vars = _choose(cluster.prom, d["templating"]["list"])
    assert empty_vars == [], f"{path.name}: variables without options: {empty_vars}"
    if "job" in chosen:
        assert chosen["job"] == [JOB], chosen
    assert chosen.get("cluster", ".*") == ".*"
    queries = _queries(d)
    empty = []
    for where, expr, instant in queries:
        promql = interpolate(expr, chosen)
        if instant:
            result = cluster.prom.query(promql)  # fails the test on a parse error
            has_data = bool(result)
        else:
            result = query_range(cluster.prom, promql, window_s=time.time() - cluster.started)
            has_data = any(r["values"] for r in result)
        if not has_data:
            empty.append(f"{where}: {promql}")
    print(f"{path.name}: {len(queries) - len(empty)}/{len(queries)} queries returned data, "
          f"{len(d['panels'])} panels, {len(chosen)} variables resolved")
    assert empty == [], f"{path.name}: {len(empty)} of {len(queries)} queries returned no data:\n" + "\n".join(empty)


def test_the_planted_faults_show_where_they_were_planted(cluster: Cluster) -> None:
    """Not only data: the hot GPU capped, the XID, the lost GPU and the straggler, each on its own GPU."""
    prom = cluster.prom

    def gpus(result: list[dict[str, Any]]) -> set[tuple[str, str]]:
        return {(r["metric"]["instance"], r["metric"]["gpu"]) for r in result}

    addr = {node: a.address for node, a in cluster.agents.items()}
    where = {name: (addr[node], str(g)) for name, (node, g) in
             {"hot": HOT, "xid": XID_GPU, "lost": LOST, "starved": STARVED, "link": BAD_LINK}.items()}
    capped = prom.wait_for("gpumond_gpu_power_limit_watts < gpumond_gpu_power_limit_default_watts", timeout=60,
                           what="the hot GPU's power capped by the policy")
    assert where["hot"] in gpus(capped), capped
    assert gpus(prom.query('gpumond_gpu_xid_errors_total{xid="48"}')) == {where["xid"]}
    assert gpus(prom.query("gpumond_gpu_up == 0")) == {where["lost"]}
    replaying = prom.wait_for('rate(gpumond_gpu_nvlink_errors_total{type="replay"}[1m]) > 0', timeout=60,
                              what="the degraded NVLink's replays")
    assert gpus(replaying) == {where["link"]}, replaying
    uuid = {(r["metric"]["instance"], r["metric"]["gpu"]): r["metric"]["uuid"] for r in prom.query("gpumond_gpu_info")}
    stragglers = {r["metric"]["gpu_uuid"] for r in prom.query('gpumond_finding{kind="straggler"}')}
    assert uuid[where["hot"]] in stragglers, (stragglers, uuid[where["hot"]])
    starved = {r["metric"]["gpu_uuid"] for r in prom.query('gpumond_finding{kind="io_starved_rank"}')}
    assert uuid[where["starved"]] in starved
    # Both daemons' alerts are on the dashboards' alert tables: the agent's XID, the rules service's straggler.
    xid_alert = prom.query('gpumond_alert_active{alertname="GpuXidCritical", xid="48"}')
    assert gpus(xid_alert) == {where["xid"]}, xid_alert
    straggler_alert = prom.wait_for('gpumond_alert_active{alertname="TrainingStraggler"}', timeout=30,
                                    what="the rules service's TrainingStraggler in gpumond_alert_active")
    assert {r["metric"]["exported_job"] for r in straggler_alert} == {JOB}


def test_the_job_share_panels_show_the_shares_the_ranks_pushed(cluster: Cluster) -> None:
    """The Job dashboard's share panels, as Grafana queries them, against what the simulated ranks push: each
    computes STEP_S (the hot GPU's rank longer), the starved rank first waits DATA_WAIT_S on its loader, and all
    wait at the barrier for the slowest. Every share is 0–1 of the step and a rank's three add up to about 1;
    the rank that waits least in the collectives is the slowest one (hot or starved), never a healthy one."""
    d = json.loads((DASHBOARDS / "gpumond-job.json").read_text())
    chosen, _ = _choose(cluster.prom, d["templating"]["list"])
    exprs = {p["title"]: p["targets"][0]["expr"] for p in d["panels"] if p.get("targets")}

    def by_rank(title: str) -> dict[str, tuple[str, float]]:
        result = cluster.prom.query(interpolate(exprs[title], chosen))
        return {r["metric"]["rank"]: (r["metric"]["gpu_uuid"], float(r["value"][1])) for r in result}

    cluster.prom.wait_for("gpumond_job_rank_comm_wait_ratio", lambda r: len(r) >= 12, timeout=60,
                          what="every rank's comm-wait share in Prometheus")
    data, compute, comm = by_rank("Data-loader wait share"), by_rank("Compute share"), by_rank("Comm wait share")
    deviation = by_rank("Compute share against the step's mean")
    assert set(comm) == set(compute) == set(deviation) and set(comm) <= set(data) and len(comm) >= 12
    uuid = {(r["metric"]["instance"], r["metric"]["gpu"]): r["metric"]["uuid"] for r in cluster.prom.query("gpumond_gpu_info")}
    addr = {node: a.address for node, a in cluster.agents.items()}
    hot, starved = uuid[(addr[HOT[0]], str(HOT[1]))], uuid[(addr[STARVED[0]], str(STARVED[1]))]
    for rank in comm:
        shares = (data[rank][1], compute[rank][1], comm[rank][1])
        assert all(0.0 <= x <= 1.0 for x in shares), (rank, shares)
        assert abs(sum(shares) - 1.0) < 0.1, (rank, shares)  # medians of each: close to, not exactly, 1
    starved_rank = next(r for r, (u, _) in data.items() if u == starved)
    assert data[starved_rank][1] > 0.2 and comm[starved_rank][1] < 0.1, (data[starved_rank], comm[starved_rank])
    healthy = [r for r, (u, _) in comm.items() if u not in (hot, starved)]
    assert min(comm[r][1] for r in healthy) > 0.1, comm  # they wait for the slowest
    assert all(abs(data[r][1]) < 0.05 for r in healthy), data
    least = min(comm, key=lambda r: comm[r][1])
    assert comm[least][0] in (hot, starved), (least, comm)
