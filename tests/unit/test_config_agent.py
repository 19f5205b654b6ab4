"""AgentConfig: defaults, bounds, strictness, immutability."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpumond.config import AgentConfig, ListenAddress


def validate(data: dict, hostname: str = "node-a") -> AgentConfig:
    return AgentConfig.model_validate(data, context={"hostname": hostname})


def test_defaults_match_the_documented_values() -> None:
    config = validate({})
    assert str(config.listen) == "0.0.0.0:9480"
    assert config.node_name == "node-a"
    assert config.sampling.fast_interval_s == 1.0
    assert config.sampling.slow_interval_s == 30.0
    assert config.sampling.xid_events is True
    assert config.sampling.nvml_retry_max_s == 300
    assert config.jobs.enabled and config.jobs.kubernetes_pods
    assert config.jobs.env_vars == ("GPUMOND_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
    assert config.jobs.cache_size == 4096
    assert config.host.enabled is True
    assert config.state_dir == Path("/var/lib/gpumond")
    assert (config.log.level, config.log.format) == ("info", "logfmt")


def test_default_node_name_is_the_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "gpu-node-07")
    assert AgentConfig.default().node_name == "gpu-node-07"
    assert AgentConfig.model_validate({"node_name": None}).node_name == "gpu-node-07"
    assert AgentConfig.model_validate({"node_name": "rack3-n2"}).node_name == "rack3-n2"


def test_config_is_frozen_and_hashable() -> None:
    config = validate({})
    with pytest.raises(ValidationError):
        config.listen = ListenAddress("127.0.0.1", 1)  # type: ignore[misc]
    assert hash(config) == hash(validate({}))


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("0.0.0.0:9480", "0.0.0.0", 9480),
        ("localhost:1", "localhost", 1),
        ("gpu-node-01.example:65535", "gpu-node-01.example", 65535),
        ("[::1]:9480", "::1", 9480),
        ("[::]:9480", "::", 9480),
    ],
)
def test_listen_accepts(text: str, host: str, port: int) -> None:
    listen = validate({"listen": text}).listen
    assert (listen.host, listen.port) == (host, port)
    assert str(listen) == text


@pytest.mark.parametrize(
    "text", ["9480", ":9480", "host:", "host:0", "host:65536", "host:http", "::1:9480",
             "[nothost]:9480", "[]:9480", "my host:9480"],
)
def test_listen_rejects(text: str) -> None:
    with pytest.raises(ValidationError):
        validate({"listen": text})


def test_listen_rejects_a_bare_number() -> None:
    with pytest.raises(ValidationError):
        validate({"listen": 9480})


def test_listen_serialises_back_to_text() -> None:
    assert validate({"listen": "[::1]:9480"}).model_dump(mode="json")["listen"] == "[::1]:9480"


@pytest.mark.parametrize(
    "sampling",
    [
        {"fast_interval_s": 0},
        {"fast_interval_s": -1},
        {"fast_interval_s": 61},
        {"slow_interval_s": 3601},
        {"fast_interval_s": 10, "slow_interval_s": 5},
        {"nvml_retry_max_s": 0},
        {"fast_interval_s": float("nan")},
        {"fast_interval_s": "1"},  # a quoted number is a mistake, not a number
        {"xid_events": 1},
        {"xid_events": "yes"},
    ],
)
def test_sampling_rejects(sampling: dict) -> None:
    with pytest.raises(ValidationError):
        validate({"sampling": sampling})


def test_sampling_accepts_edges_and_integers() -> None:
    sampling = validate({"sampling": {"fast_interval_s": 60, "slow_interval_s": 60}}).sampling
    assert sampling.fast_interval_s == 60.0 and isinstance(sampling.fast_interval_s, float)


@pytest.mark.parametrize(
    "jobs",
    [
        {"env_vars": []},
        {"env_vars": "SLURM_JOB_ID"},
        {"env_vars": ["SLURM JOB"]},
        {"env_vars": ["1ABC"]},
        {"env_vars": [3]},
        {"cache_size": 15},
        {"cache_size": 16.5},
    ],
)
def test_jobs_rejects(jobs: dict) -> None:
    with pytest.raises(ValidationError):
        validate({"jobs": jobs})


def test_jobs_env_vars_keep_their_order() -> None:
    assert validate({"jobs": {"env_vars": ["B", "A_1"]}}).jobs.env_vars == ("B", "A_1")


def test_log_settings_are_case_insensitive_but_closed() -> None:
    assert validate({"log": {"level": "DEBUG", "format": "JSON"}}).log.level == "debug"
    for bad in ({"level": "trace"}, {"format": "xml"}, {"level": 10}):
        with pytest.raises(ValidationError):
            validate({"log": bad})


@pytest.mark.parametrize("data", [{"state_dir": "var/lib/gpumond"}, {"node_name": ""}, {"node_name": 7}])
def test_top_level_rejects(data: dict) -> None:
    with pytest.raises(ValidationError):
        validate(data)


@pytest.mark.parametrize(
    "data", [{"lsiten": "0.0.0.0:1"}, {"sampling": {"fast": 1}}, {"host": {"enabled": True, "cpu": 1}},
             {"policy": {"thermal": {"targetc": 80}}}, {"alerting": {"slak": {}}}],
)
def test_unknown_keys_are_errors(data: dict) -> None:
    with pytest.raises(ValidationError):
        validate(data)


def test_relay_is_off_by_default_and_listens_on_loopback() -> None:
    relay = AgentConfig.default().relay
    assert not relay.enabled and str(relay.listen) == "127.0.0.1:9482"
    assert (relay.interval_s, relay.buffer_max_bytes, relay.buffer_max_age_s) == (2.0, 64 * 1024 * 1024, 600.0)


def test_relay_takes_a_sharded_upstream_with_its_count() -> None:
    relay = AgentConfig.model_validate({"relay": {"upstream": "http://rules-{shard}.rules:9481", "shards": 4,
                                                  "listen": "10.0.0.7:9482"}}).relay
    assert relay.enabled and relay.shards == 4 and relay.listen == ListenAddress("10.0.0.7", 9482)


@pytest.mark.parametrize("relay, fragment", [
    ({"listen": "0.0.0.0:9482"}, "every network of the node"),
    ({"listen": "[::]:9482"}, "every network of the node"),
    ({"upstream": "http://rules-{shard}:9481"}, "set shards"),
    ({"upstream": "http://rules:9481", "shards": 2}, "has no {shard}"),
    ({"upstream": "ftp://rules:9481"}, "http:// or https://"),
    ({"interval_s": 0}, "greater than 0"),
    ({"buffer_max_bytes": 1000}, "greater than or equal to 65536"),
])
def test_relay_rejects(relay: dict, fragment: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(fragment)):
        AgentConfig.model_validate({"relay": relay})


def test_relay_listen_flag_replaces_only_that_key() -> None:
    import argparse

    from gpumond.cli.daemon import with_flags

    cfg = AgentConfig.model_validate({"relay": {"upstream": "http://rules:9481", "interval_s": 1}})
    args = argparse.Namespace(log_level=None, log_format=None)
    out = with_flags(cfg, "agent", args, [("--relay-listen", "10.1.2.3:9482", ListenAddress.parse, "relay.listen")])
    assert out.relay.listen == ListenAddress("10.1.2.3", 9482)
    assert out.relay.upstream == "http://rules:9481" and out.relay.interval_s == 1 and out.listen == cfg.listen
