"""The node relay in the Helm chart: how job pods reach the agent on their node, and where the agent forwards.

Rendered by the real Helm engine (helm-python-sdk) and validated against the Kubernetes schemas
(kubernetes-validate), like every object of test_helm_chart.py; here the relay's ports, environment, arguments,
Service and agent.yaml section are checked against each other and against what gpumond itself reads.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import helm_python
import pytest

from gpumond.config.agent import AgentConfig
from gpumond.wire.routing import shard_endpoint, shard_of
from tests.integration.helm_helpers import (NAMESPACE, RELEASE, config_of, container_of, expand_args, notes, one,
                                            pod_security_violations, render, rendered, run_rendered, secret_env,
                                            validation_problems, values_of)
from tests.integration.helpers import LOOPBACK, http_get, parse_metrics, value, wait_until

pytestmark = pytest.mark.integration

RELAY_SERVICE = f"{RELEASE}-gpumond-relay"
RULES = f"{RELEASE}-gpumond-rules"
CHART_BUFFER = 24 * 2**20  # the chart's relay.buffer_max_bytes: what fits its memory limit


def _pod(objects: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> dict[str, Any]:
    return one(objects, "DaemonSet")["spec"]["template"]


def _agent(objects: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> dict[str, Any]:
    return _pod(objects)["spec"]["containers"][0]


def _port(container: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((p for p in container["ports"] if p["name"] == name), None)


def _relay_listen(container: dict[str, Any], pod_ip: str = "10.1.2.3") -> str | None:
    """The --relay-listen the kubelet would give the agent, with POD_IP from the downward API."""
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    args = expand_args(container, {"POD_IP": pod_ip})
    return next((a.split("=", 1)[1] for a in args if a.startswith("--relay-listen=")), None)


def test_default_exposes_the_relay_through_a_node_local_service() -> None:
    objects = rendered(None)
    container = _agent(objects)
    # The pod binds its own address (it cannot bind the node's from its own network namespace), never a wildcard.
    assert _relay_listen(container) == "10.1.2.3:9482"
    assert _port(container, "relay") == {"name": "relay", "containerPort": 9482, "protocol": "TCP"}  # no hostPort
    service = one(objects, "Service", RELAY_SERVICE)
    spec = service["spec"]
    # Only the agent on the sender's node; dropped (the SDK falls back to the rules service) when it is not ready.
    assert spec["internalTrafficPolicy"] == "Local" and spec["type"] == "ClusterIP"
    assert spec["ports"] == [{"name": "relay", "port": 9482, "targetPort": "relay", "protocol": "TCP"}]
    assert spec["selector"].items() <= _pod(objects)["metadata"]["labels"].items()
    # The agent's ServiceMonitor selects component=agent: the relay Service (no metrics port) is not among them.
    monitor = one(rendered("ci/monitors-values.yaml"), "ServiceMonitor", f"{RELEASE}-gpumond-agent")
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert validation_problems(service) == []
    # The relay forwards to this release's rules Service, on its port.
    rules = one(objects, "Service", RULES)
    relay = config_of(objects, "agent")["relay"]
    assert relay == {"upstream": f"http://{RULES}.{NAMESPACE}.svc:{rules['spec']['ports'][0]['port']}",
                     "buffer_max_bytes": CHART_BUFFER}
    text = notes({})
    assert f"GPUMOND_RELAY=http://{RELAY_SERVICE}.{NAMESPACE}.svc:9482\n" in text
    # The SDK names its host (the pod) as the node unless told, and the relay keeps what a push names.
    assert "GPUMOND_NODE=$(NODE_NAME)      in the pod spec: env NODE_NAME from fieldRef spec.nodeName" in text
    assert f"GPUMOND_ENDPOINT=http://{RULES}.{NAMESPACE}.svc:9481\n" in text  # the fallback


def test_the_rendered_relay_section_is_what_the_agent_runs() -> None:
    """agent.yaml's relay, with the DaemonSet's --relay-listen, is a relay gpumond turns on at the pod's address."""
    objects = rendered(None)
    config = AgentConfig.model_validate(config_of(objects, "agent"))
    assert config.relay.enabled and config.relay.upstream == f"http://{RULES}.{NAMESPACE}.svc:9481"
    assert config.relay.interval_s == 2.0  # the model's default: the chart adds nothing of its own


# The agent's RSS with the relay at work and little held (benchmarks/results/relay_agent_cost.md: 77 MiB), rounded
# up: what a full buffer comes on top of.
AGENT_RSS_MIB = 80


def _mib(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    return float(quantity[:-2]) * units[quantity[-2:]]


@pytest.mark.parametrize("values", [None, {"agent": {"resources": {"limits": {"memory": "512Mi"}}}}],
                         ids=["default limit", "raised limit"])
def test_a_full_relay_buffer_fits_the_agents_memory_limit(values: dict[str, Any] | None) -> None:
    """The relay holds up to relay.buffer_max_bytes through a long rules outage (or a flood from the pod network):
    with the daemon's 64 MiB default under the chart's 128Mi limit the kernel killed the agent when it filled,
    losing everything held. The chart sizes the buffer to the limit the agent runs under."""
    objects = render(values) if values is not None else rendered(None)
    limit = _mib(_agent(objects)["resources"]["limits"]["memory"])
    held = AgentConfig.model_validate(config_of(objects, "agent")).relay.buffer_max_bytes / 2**20
    assert AGENT_RSS_MIB + held <= limit * 0.9, (held, limit)
    assert held >= 8  # still minutes of a busy node (8 ranks × 2 steps/s: ~2 KiB/s with bookkeeping)


def test_an_ipv6_pod_address_is_bracketed() -> None:
    """An IPv6-only pod network: the agent gets [fd00::7]:9482, which it parses (unbracketed it would exit 2)."""
    from gpumond.config import ListenAddress
    from gpumond.config.agent import relay_listen_problem

    listen = _relay_listen(_agent(render({"agent": {"relay": {"ipFamily": "IPv6"}}})), "fd00::7")
    assert listen == "[fd00::7]:9482"
    assert relay_listen_problem(ListenAddress.parse(listen)) is None
    with pytest.raises(ValueError, match="brackets"):
        ListenAddress.parse(_relay_listen(_agent(rendered(None)), "fd00::7"))


def test_read_only_agent_with_the_relay_still_meets_restricted() -> None:
    objects = rendered("ci/readonly-values.yaml")
    assert _port(_agent(objects), "relay") is not None
    assert pod_security_violations(_pod(objects)["spec"]) == []


def test_host_port_mode() -> None:
    """expose hostPort: the relay's port on the node's address, no Service; jobs take HOST_IP from the downward API."""
    values = {"agent": {"relay": {"expose": "hostPort", "port": 9490}}}
    objects = render(values)
    container = _agent(objects)
    assert _port(container, "relay") == {"name": "relay", "containerPort": 9490, "hostPort": 9490, "protocol": "TCP"}
    assert _relay_listen(container) == "10.1.2.3:9490"
    assert not any(o["kind"] == "Service" and o["metadata"]["name"] == RELAY_SERVICE for o in objects)
    assert [p for o in objects for p in validation_problems(o)] == []
    text = notes(values)
    assert "GPUMOND_RELAY=http://$(HOST_IP):9490" in text and "status.hostIP" in text
    # The trade-off the values file states: a host port is outside Pod Security "baseline".
    read_only = render({**values_of("ci/readonly-values.yaml"), **values})
    assert "baseline: agent hostPort" in pod_security_violations(_pod(read_only)["spec"])


def test_notes_give_https_addresses_when_the_daemons_serve_tls() -> None:
    """tls.enabled serves the relay (the agent's listeners) and the rules service over https only: an http:// address
    from the NOTES makes every push to the relay fail and fall back, and one to the rules service fail."""
    values = values_of("ci/tls-values.yaml")
    text = notes(values)
    assert f"GPUMOND_RELAY=https://{RELAY_SERVICE}.{NAMESPACE}.svc:9482\n" in text
    assert f"GPUMOND_ENDPOINT=https://{RULES}.{NAMESPACE}.svc:9481\n" in text
    # The agents' one certificate must name the relay Service, or the SDK refuses the relay's certificate.
    assert f"the agents' certificate (tls.agentSecret) must name {RELAY_SERVICE}.{NAMESPACE}.svc" in text
    host_port = notes({**values, "agent": {"relay": {"expose": "hostPort"}}})
    assert "GPUMOND_RELAY=https://$(HOST_IP):9482" in host_port
    assert "the agents' certificate (tls.agentSecret) must name every node's address" in host_port
    assert "http://" not in host_port.split("Training jobs")[1]


def test_sharded_upstream_routes_each_job_to_the_pod_of_its_shard() -> None:
    """The relay gets the same template and count as the SDK: a job's batch lands on its shard's StatefulSet pod."""
    objects = rendered("ci/sharded-values.yaml")
    relay = config_of(objects, "agent")["relay"]
    replicas = one(objects, "StatefulSet")["spec"]["replicas"]
    assert relay["shards"] == replicas == 4
    assert relay["upstream"] == f"http://{RULES}-{{shard}}.{RULES}-shards.{NAMESPACE}.svc:9481"
    assert f"GPUMOND_ENDPOINT='{relay['upstream']}'" in notes(values_of("ci/sharded-values.yaml"))
    for job in ("train-llm-7", "slurm-48213", "a"):
        host = shard_endpoint(relay["upstream"], job, relay["shards"]).split("//")[1].split(".")[0]
        assert host == f"{RULES}-{shard_of(job, replicas)}"  # the pod name <statefulset>-<ordinal>
    assert AgentConfig.model_validate(config_of(objects, "agent")).relay.shards == 4


def test_tls_upstream_uses_the_mounted_certificates() -> None:
    """tls.enabled: https to the rules service, its CA from the agent's mounted Secret; with mutual TLS the
    agent's own certificate (cert-manager's usages: server auth, client auth) as the client's."""
    objects = rendered("ci/tls-values.yaml")
    relay = config_of(objects, "agent")["relay"]
    assert relay["upstream"].startswith("https://")
    assert relay["tls_config"] == {"ca_file": "/etc/gpumond-tls/ca.crt", "cert_file": "/etc/gpumond-tls/tls.crt",
                                   "key_file": "/etc/gpumond-tls/tls.key"}
    mount = next(m for m in _agent(objects)["volumeMounts"] if m["name"] == "tls")
    assert mount["mountPath"] == "/etc/gpumond-tls"
    one_way = render({"tls": {"enabled": True, "agentSecret": "a", "rulesSecret": "r"}})
    assert config_of(one_way, "agent")["relay"]["tls_config"] == {"ca_file": "/etc/gpumond-tls/ca.crt"}


def test_operator_settings_are_kept() -> None:
    """agent.config.relay: the operator's upstream, buffers and client settings win over the chart's defaults."""
    given = {"upstream": "https://rules.example.com:9481", "buffer_max_bytes": 16 * 1024 * 1024,
             "buffer_max_age_s": 300, "interval_s": 1,
             "authorization": {"credentials_file": "/etc/gpumond/relay-token"}}
    objects = render({"agent": {"config": {"relay": given}}, "tls": {"enabled": True, "agentSecret": "a",
                                                                     "rulesSecret": "r"}})
    assert config_of(objects, "agent")["relay"] == given  # no tls_config added to someone else's server


def test_disabled_leaves_no_trace() -> None:
    objects = render({"agent": {"relay": {"enabled": False}}})
    container = _agent(objects)
    assert _port(container, "relay") is None and "POD_IP" not in {e["name"] for e in container["env"]}
    assert not any(a.startswith("--relay-listen") for a in container["args"])
    assert not any(o["metadata"]["name"] == RELAY_SERVICE for o in objects)
    assert "relay" not in config_of(objects, "agent")
    assert "GPUMOND_RELAY" not in notes({"agent": {"relay": {"enabled": False}}})


@pytest.mark.parametrize(("values", "message"), [
    ({"agent": {"config": {"relay": {"listen": "127.0.0.1:9482"}}}},
     "agent.config.relay.listen: set by the chart (the pod's address, port agent.relay.port 9482)"),
    ({"rules": {"enabled": False}},
     "agent.config.relay.upstream: rules.enabled is false, so the relay has no rules service to default to"),
    ({"agent": {"relay": {"enabled": False}, "config": {"relay": {"upstream": "http://rules:9481"}}}},
     "agent.config.relay: agent.relay.enabled is false, so no pod could reach the relay"),
    ({"agent": {"relay": {"port": 9480}}}, "agent.relay.port: 9480 is agent.port as well"),
    ({"agent": {"relay": {"nodeToken": True}, "config": {"relay": {"authorization": {
        "credentials_file": "/etc/gpumond/relay-token"}}}}},
     "agent.relay.nodeToken gives the relay its authorization"),
    ({"rules": {"enabled": False}, "agent": {"relay": {"nodeToken": True}, "config": {"relay": {
        "upstream": "http://rules.example.com:9481"}}}},
     "agent.relay.nodeToken: no Secret holds a token for the relay"),
], ids=["listen-owned", "no-rules-no-upstream", "config-while-disabled", "port-clash", "node-token-and-authorization",
        "node-token-without-secret"])
def test_contradictions_fail_with_one_line(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmRenderError) as err:
        render(values)
    assert message in str(err.value) and "\n" not in str(err.value).strip()


@pytest.mark.parametrize(("values", "message"), [
    ({"agent": {"relay": {"expose": "nodePort"}}}, "at '/agent/relay/expose'"),
    ({"agent": {"relay": {"port": 0}}}, "at '/agent/relay/port': minimum: got 0, want 1"),
    ({"agent": {"config": {"relay": {"buffer_max_bytes": 1024}}}}, "at '/agent/config/relay/buffer_max_bytes'"),
], ids=["expose", "port", "buffer-bound"])
def test_schema_refuses_bad_relay_values(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmValuesError) as err:
        render(values)
    assert message in str(err.value)


def test_an_external_upstream_without_the_rules_service() -> None:
    objects = render({"rules": {"enabled": False},
                      "agent": {"config": {"relay": {"upstream": "http://rules.example.com:9481"}}}})
    assert config_of(objects, "agent")["relay"] == {"upstream": "http://rules.example.com:9481",
                                                    "buffer_max_bytes": CHART_BUFFER}
    assert [p for o in objects for p in validation_problems(o)] == []


def test_node_token() -> None:
    """agent.relay.nodeToken: the first rules token, under its own key of the Secret, mounted into the agent and named
    by agent.yaml; an existing Secret is read under the same key."""
    tokens = ["0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"]
    objects = render({"agent": {"relay": {"nodeToken": True}}, "secret": {"rulesTokens": tokens}})
    data = one(objects, "Secret")["data"]
    assert base64.b64decode(data["relay-token"]).decode() == tokens[0]
    pod = _pod(objects)["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "relay-token")
    assert volume["secret"] == {"secretName": f"{RELEASE}-gpumond-secrets",
                                "items": [{"key": "relay-token", "path": "token"}]}
    mount = next(m for m in _agent(objects)["volumeMounts"] if m["name"] == "relay-token")
    relay = config_of(objects, "agent")["relay"]
    assert relay["authorization"] == {"credentials_file": f"{mount['mountPath']}/token"}
    assert [p for o in objects for p in validation_problems(o)] == []
    generated = render({"agent": {"relay": {"nodeToken": True}}})  # one random token, the same under both keys
    data = {k: base64.b64decode(v).decode() for k, v in one(generated, "Secret")["data"].items()}
    assert data["relay-token"] == data["rules-tokens"] and len(data["relay-token"]) == 48
    existing = render({**values_of("ci/existing-secret-values.yaml"), "agent": {"relay": {"nodeToken": True}}})
    assert not any(o["kind"] == "Secret" for o in existing)
    assert next(v for v in _pod(existing)["spec"]["volumes"] if v["name"] == "relay-token")["secret"][
        "secretName"] == values_of("ci/existing-secret-values.yaml")["secret"]["existingSecret"]
    assert "relay-token" not in one(rendered(None), "Secret")["data"]  # off by default
    assert "the relay pushes under its own token" in notes({"agent": {"relay": {"nodeToken": True}}})


@pytest.mark.parametrize("values", [{}, {"agent": {"relay": {"nodeToken": True}}}], ids=["rank-token", "node-token"])
def test_rendered_agent_relays_a_job_to_the_rendered_rules_service(values: dict[str, Any], tmp_path: Path) -> None:
    """The chart's two containers as rendered (args, agent.yaml, the Secret's token), the relay's upstream pointed
    at the rules container on loopback: a real SDK rank pushing to the relay lands in the rules service, through it.
    With agent.relay.nodeToken the rank sends no token at all."""
    from gpumond.job import Reporter

    objects = tuple(render(values))
    node_token = bool(values)
    for component in ("rules", "agent"):
        (tmp_path / component).mkdir()
    rules, rules_port, _ = run_rendered(objects, "rules", tmp_path / "rules", {}, [])
    agent, agent_port, info = run_rendered(objects, "agent", tmp_path / "agent", {"NODE_NAME": "gpu-node-7"},
                                           ["--sim", "2"], relay_upstream=f"http://{LOOPBACK}:{rules_port}")
    # The ranks' token passes through the relay: one of the rules service's, from the Secret the chart made.
    token = secret_env(objects, container_of(objects, "rules"))["GPUMOND_RULES_TOKENS"].split(",")[0]
    with rules, agent:
        rules.spawn()
        agent.spawn()
        for port, proc in ((rules_port, rules), (agent_port, agent)):
            wait_until(lambda p=port: http_get(f"http://{LOOPBACK}:{p}/healthz", timeout=1.0)[0] == 200, timeout=30,
                       what=f"GET :{port}/healthz to answer 200", describe=proc.describe)
        # GPUMOND_RELAY as the chart's NOTES print it, with the Service's address standing in for the pod's.
        rank = Reporter(endpoint=f"http://{LOOPBACK}:{rules_port}", relay=f"http://{info['relay']}",
                        token=None if node_token else token,
                        job="chart-relay-job", rank=0, world_size=1, node="gpu-node-7",
                        gpu_uuid="GPU-00000000-0000-4000-8000-000000000001", push_interval_s=0.5,
                        handle_sigterm=False)
        for _ in range(6):
            rank.step_end(samples=8)
        rank.close(10.0)
        assert rank.stats.pushed_steps == 6, rank.stats

        def forwarded() -> float | None:
            families = parse_metrics(http_get(f"http://{LOOPBACK}:{agent_port}/metrics")[2].decode())
            return value(families, "gpumond_relay_steps_forwarded_total")

        wait_until(lambda: forwarded() == 6, timeout=20, what="the relay to forward the rank's 6 steps",
                   describe=agent.describe)
        stored = parse_metrics(http_get(f"http://{LOOPBACK}:{rules_port}/metrics")[2].decode())
        assert value(stored, "gpumond_rules_push_steps_total", result="accepted") == 6
