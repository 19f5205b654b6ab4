"""Both daemons over TLS as real processes, with certificates made in the test (tests/pki.py):

- a real Prometheus, configured the way its docs say (`scheme: https`, `tls_config` with a client
  certificate, `basic_auth`), scrapes an agent that requires client certificates and a password;
- the job SDK pushes to the rules service over mutual TLS, and refuses a server it cannot verify;
- the rules service's scrape of agents works over mutual TLS with basic auth, and its Prometheus source reads
  a Prometheus that serves TLS from the very same web config file (the format is exporter-toolkit's);
- a bad or mismatched certificate stops a daemon at start with one line and exit status 2.
"""

from __future__ import annotations

import base64
import ssl
import time
from pathlib import Path

import bcrypt
import pytest
import yaml

from gpumond.job import Reporter
from gpumond.wire.tlsclient import ClientTLS
from gpumond.web.client import build_access
from gpumond.rules.telemetry.promql import PrometheusSource
from gpumond.rules.telemetry.scrape import ScrapeSource
from tests.integration.alert_helpers import TOKEN, RulesDaemon
from tests.integration.helpers import AgentProcess, PrometheusServer, http_get, wait_until, write_yaml
from tests.pki import CA

pytestmark = pytest.mark.integration

GPU = "GPU-00000000-0000-4000-8000-000000000026"
PASSWORD = "scrape-password-26"


@pytest.fixture()
def pki(tmp_path: Path) -> dict:
    ca = CA(tmp_path / "pki")
    return {"ca": ca, "server": ca.issue("tls"), "client": ca.issue("client", client=True)}


def web_config(tmp_path: Path, pki: dict, *, mtls: bool = True, users: bool = False) -> Path:
    tls = {"cert_file": str(pki["server"].cert), "key_file": str(pki["server"].key)}
    if mtls:
        tls |= {"client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki["ca"].path)}
    config: dict = {"tls_server_config": tls}
    if users:  # cost 4: the format is the same as cost 10, and the test stays fast
        config["basic_auth_users"] = {"prometheus": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()}
    return write_yaml(tmp_path / "web.yml", config)


def context(pki: dict, *, with_client_cert: bool = True) -> ssl.SSLContext:
    c = pki["client"]
    return ClientTLS(pki["ca"].path, c.cert if with_client_cert else None, c.key if with_client_cert else None).context


def expiry(metrics: bytes) -> float:
    """The served certificate's not-after time from a daemon's /metrics."""
    name = b"gpumond_tls_certificate_not_after_timestamp_seconds "
    [line] = [line for line in metrics.splitlines() if line.startswith(name)]
    return float(line[len(name):])


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_prometheus_scrapes_an_agent_over_mutual_tls_with_basic_auth(tmp_path, pki) -> None:
    web = web_config(tmp_path, pki, users=True)
    with AgentProcess(["--sim", "2", "--web.config.file", web], tmp_path / "agent", tls=context(pki)) as agent:
        # read auth: /metrics needs the password, /healthz (probes) does not
        assert agent.get("/metrics")[0] == 401
        assert agent.get("/metrics", basic("prometheus", "wrong"))[0] == 401
        status, _, body = agent.get("/metrics", basic("prometheus", PASSWORD))
        assert status == 200
        assert expiry(body) == pki["server"].not_after  # the certificate it serves, for the expiry alert
        assert agent.get("/healthz")[0] == 200
        password_file = tmp_path / "password"
        password_file.write_text(PASSWORD)
        c = pki["client"]
        job = {"job_name": "gpumond-mtls", "scheme": "https",
               "tls_config": {"ca_file": str(pki["ca"].path), "cert_file": str(c.cert), "key_file": str(c.key)},
               "basic_auth": {"username": "prometheus", "password_file": str(password_file)},
               "static_configs": [{"targets": [agent.address]}]}
        # the same agent without a client certificate: Prometheus must fail to scrape it
        no_cert = {"job_name": "gpumond-no-cert", "scheme": "https", "tls_config": {"ca_file": str(pki["ca"].path)},
                   "static_configs": [{"targets": [agent.address]}]}
        with PrometheusServer([], tmp_path / "prometheus", extra_scrape_configs=[job, no_cert]) as prom:
            prom.wait_for('up{job="gpumond-mtls"} == 1', what="the mTLS scrape to succeed")
            prom.wait_for('gpumond_gpu_up{job="gpumond-mtls"}', lambda r: len(r) == 2, what="both GPUs scraped")
            prom.wait_for('up{job="gpumond-no-cert"} == 0', what="the scrape without a certificate to fail")
            refused = [t for t in prom.targets() if t["labels"]["job"] == "gpumond-no-cert"]
            assert "certificate required" in refused[0]["lastError"], refused
    assert agent.returncode == 0, agent.describe()


def test_the_job_sdk_pushes_over_mutual_tls_and_refuses_a_server_it_cannot_verify(tmp_path, pki) -> None:
    web = web_config(tmp_path, pki)
    rules = RulesDaemon(tmp_path / "rules", {"tokens": [TOKEN], "web_config_file": str(web),
                                             "state_dir": str(tmp_path / "state")}, tls=context(pki))
    with rules.start():
        c = pki["client"]
        common = {"endpoint": rules.url, "token": TOKEN, "job": "tls-job", "rank": 0, "world_size": 1,
                  "node": "node-a", "gpu_uuid": GPU, "push_interval_s": 0.05}
        rep = Reporter(**common, ca_file=str(pki["ca"].path), cert_file=str(c.cert), key_file=str(c.key))
        assert rep.enabled, rep.stats.last_error
        for _ in range(3):
            rep.step_end(samples=1)
        wait_until(lambda: rep.stats.pushed_steps == 3, timeout=15, what="3 steps pushed over TLS")
        rep.close()
        assert rep.stats.failed_pushes == 0
        # the service holds them: its findings API (read side, mTLS) answers
        assert http_get(f"{rules.url}/api/v1/findings", context=context(pki))[0] == 200
        assert expiry(http_get(f"{rules.url}/metrics", context=context(pki))[2]) == pki["server"].not_after

        # no CA configured: the system bundle does not know the test CA, so the SDK refuses the server
        stranger = Reporter(**common, cert_file=str(c.cert), key_file=str(c.key))
        stranger.step_end(samples=1)
        wait_until(lambda: stranger.stats.failed_pushes >= 1, timeout=15, what="the unverifiable push to fail")
        stranger.close(timeout_s=0.5)
        assert stranger.stats.pushed_steps == 0
        assert "cannot verify the server's certificate" in (stranger.stats.last_error or "")
        assert "GPUMOND_CA_FILE" in (stranger.stats.last_error or "")

        # a CA but no client certificate: the service refuses the connection, and the SDK says why
        anonymous = Reporter(**common, ca_file=str(pki["ca"].path))
        anonymous.step_end(samples=1)
        wait_until(lambda: anonymous.stats.failed_pushes >= 1, timeout=15, what="the push without a cert to fail")
        anonymous.close(timeout_s=0.5)
        assert "requires a client certificate" in (anonymous.stats.last_error or ""), anonymous.stats

        # http:// on the TLS port: the service closes the request unanswered; the SDK says to use https://
        plain_url = rules.url.replace("https://", "http://", 1)
        plain = Reporter(**{**common, "endpoint": plain_url})
        plain.step_end(samples=1)
        wait_until(lambda: plain.stats.failed_pushes >= 1, timeout=15, what="the plain-HTTP push to fail")
        assert f"use {rules.url} in GPUMOND_ENDPOINT" in (plain.stats.last_error or ""), plain.stats
        plain.close(timeout_s=0.5)
    assert rules.returncode == 0, rules.describe()


def test_the_rules_service_scrapes_agents_over_mutual_tls_with_basic_auth(tmp_path, pki) -> None:
    web = web_config(tmp_path, pki, users=True)
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD + "\n")
    with AgentProcess(["--sim", "2", "--web.config.file", web], tmp_path / "agent", tls=context(pki)) as agent:
        c = pki["client"]
        spec = {"tls_config": {"ca_file": pki["ca"].path, "cert_file": c.cert, "key_file": c.key},
                "basic_auth": {"username": "prometheus", "password_file": password_file}}
        source = ScrapeSource([agent.address], scheme="https", access=build_access(spec))
        try:
            batch = source.fetch()
            assert batch.errors == () and len(batch.gpus) == 2, batch.errors
            password_file.write_text("not-the-password\n")  # re-read on every fetch
            batch = source.fetch()
            assert batch.gpus == () and "HTTP 401" in batch.errors[0], batch.errors
        finally:
            source.close()
        plain = ScrapeSource([agent.address])  # http:// against a TLS port
        try:
            assert plain.fetch().gpus == ()
        finally:
            plain.close()


@pytest.mark.parametrize("fault, expected", [
    ("missing", "tls_server_config.cert_file: cannot read {cert}: no such file"),
    ("mismatched", "tls_server_config: the key in {key} does not belong to the certificate in {cert}"),
    ("garbage", "tls_server_config: cannot load the certificate {cert} with the key {key}"),
    ("expired", "tls_server_config.cert_file: the certificate in {cert} expired on"),
])
def test_a_bad_certificate_stops_the_agent_at_start_with_one_line(tmp_path, pki, fault, expected) -> None:
    server = pki["server"]
    if fault == "missing":
        server.cert.unlink()
    elif fault == "expired":
        pki["ca"].issue("tls", expired=True)  # a matching pair under the same names, past its not-after
    elif fault == "mismatched":
        other = pki["ca"].issue("other")
        server.key.write_bytes(other.key.read_bytes())
    else:
        server.cert.write_text("not a certificate\n")
    web = web_config(tmp_path, pki, mtls=False)
    agent = AgentProcess.run(["--sim", "1", "--web.config.file", web], tmp_path / "agent")
    assert agent.returncode == 2, agent.describe()
    err = agent.stderr().strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"gpumond: {web}: ") and expected.format(cert=server.cert, key=server.key) in err, err


def test_a_bad_web_config_stops_the_rules_service_at_start_with_one_line(tmp_path, pki) -> None:
    web = write_yaml(tmp_path / "web.yml", {"tls_server_config": {
        "cert_file": str(pki["server"].cert), "key_file": str(pki["server"].key),
        "client_auth_type": "RequireAnyClientCert", "client_ca_file": str(pki["ca"].path)}})
    rules = RulesDaemon(tmp_path / "rules", {"tokens": [TOKEN], "web_config_file": str(web),
                                             "state_dir": str(tmp_path / "state")})
    rules.spawn()
    assert rules.wait_exit(30) == 2
    err = rules.stderr().strip()
    assert len(err.splitlines()) == 1 and "RequireAnyClientCert" in err and "not supported by gpumond" in err, err


def test_one_web_config_file_serves_prometheus_itself_and_the_agent_and_the_rules_source_reads_both(
        tmp_path, pki) -> None:
    """The same web config file (TLS + basic_auth_users) given to a real Prometheus and to an agent: the format
    is exporter-toolkit's. Prometheus scrapes the agent over TLS with basic auth, and the rules service's
    Prometheus source reads Prometheus over TLS with basic auth."""
    web = web_config(tmp_path, pki, mtls=False, users=True)
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD)
    trust = ClientTLS(pki["ca"].path).context
    with AgentProcess(["--sim", "2", "--web.config.file", web], tmp_path / "agent", tls=trust) as agent:
        job = {"job_name": "gpumond-agent", "scheme": "https", "tls_config": {"ca_file": str(pki["ca"].path)},
               "basic_auth": {"username": "prometheus", "password_file": str(password_file)},
               "static_configs": [{"targets": [agent.address]}]}
        prom = PrometheusServer([], tmp_path / "prometheus", extra_scrape_configs=[job])
        prom.argv.append(f"--web.config.file={web}")
        prom.spawn()  # not start(): its readiness check speaks plain HTTP
        with prom:
            auth = basic("prometheus", PASSWORD)
            wait_until(lambda: http_get(f"https://127.0.0.1:{prom.port}/-/ready", auth, timeout=1.0,
                                        context=trust)[0] == 200,
                       timeout=30, what="Prometheus ready over TLS", describe=prom.describe)
            assert http_get(f"https://127.0.0.1:{prom.port}/-/ready", timeout=1.0, context=trust)[0] == 401
            spec = {"tls_config": {"ca_file": pki["ca"].path},
                    "basic_auth": {"username": "prometheus", "password_file": password_file}}
            source = PrometheusSource(f"https://127.0.0.1:{prom.port}", access=build_access(spec), lookback_s=30)
            try:
                batch = wait_until(lambda: (b := source.fetch()) and len(b.gpus) == 2 and (b,), timeout=40,
                                   what="the rules' Prometheus source to read both GPUs over TLS",
                                   describe=prom.describe)[0]
                assert not [e for e in batch.errors if "TLS" in e or "401" in e], batch.errors
            finally:
                source.close()


def test_the_alerts_and_findings_commands_read_over_mutual_tls(tmp_path, pki) -> None:
    import subprocess
    import sys

    web = web_config(tmp_path, pki)
    c = pki["client"]
    with AgentProcess(["--sim", "1", "--web.config.file", web], tmp_path / "agent", tls=context(pki)) as agent:
        def alerts(*flags: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "gpumond.cli", "alerts", "--url", agent.base_url, "--json",
                                   *flags], capture_output=True, text=True, timeout=60)

        ok = alerts("--ca-file", str(pki["ca"].path), "--cert-file", str(c.cert), "--key-file", str(c.key))
        assert ok.returncode == 0 and '"alerts"' in ok.stdout, ok.stderr
        no_ca = alerts()
        assert no_ca.returncode == 1 and "cannot verify the server's certificate" in no_ca.stderr, no_ca.stderr
        assert "--ca-file" in no_ca.stderr
        no_cert = alerts("--ca-file", str(pki["ca"].path))
        assert no_cert.returncode == 1 and "requires a client certificate" in no_cert.stderr, no_cert.stderr
        half = alerts("--cert-file", str(c.cert))
        assert half.returncode == 2 and len(half.stderr.strip().splitlines()) == 1, half.stderr


def test_the_alerts_command_sends_the_read_credentials_a_daemon_asks_for(tmp_path, pki) -> None:
    import subprocess
    import sys

    tokens = tmp_path / "read-tokens"
    tokens.write_text("a-read-token-of-26-characters\n")
    web = web_config(tmp_path, pki, mtls=False, users=True)
    write_yaml(web, {**yaml.safe_load(web.read_text()), "bearer_tokens_file": str(tokens)})
    password, token, wrong = tmp_path / "password", tmp_path / "token", tmp_path / "wrong"
    password.write_text(PASSWORD + "\n")
    token.write_text("a-read-token-of-26-characters\n")
    wrong.write_text("not-the-password\n")
    with AgentProcess(["--sim", "1", "--web.config.file", web], tmp_path / "agent", tls=context(pki)) as agent:
        def alerts(*flags: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "gpumond.cli", "alerts", "--url", agent.base_url, "--json",
                                   "--ca-file", str(pki["ca"].path), *flags], capture_output=True, text=True,
                                  timeout=60)

        anonymous = alerts()
        assert anonymous.returncode == 1 and "HTTP 401" in anonymous.stderr, anonymous.stderr
        assert "--username with --password-file, or --token-file" in anonymous.stderr
        basic_ok = alerts("--username", "prometheus", "--password-file", str(password))
        assert basic_ok.returncode == 0 and '"alerts"' in basic_ok.stdout, basic_ok.stderr
        bearer_ok = alerts("--token-file", str(token))
        assert bearer_ok.returncode == 0 and '"alerts"' in bearer_ok.stdout, bearer_ok.stderr
        refused = alerts("--username", "prometheus", "--password-file", str(wrong))
        assert refused.returncode == 1 and "HTTP 401" in refused.stderr, refused.stderr
        half = alerts("--username", "prometheus")
        assert half.returncode == 2 and "--username and --password-file go together" in half.stderr, half.stderr


def test_an_agent_alerts_an_alertmanager_behind_mutual_tls_and_basic_auth(tmp_path, pki) -> None:
    from tests.integration.alert_helpers import Alertmanager

    web = web_config(tmp_path, pki, users=True)  # the exporter-toolkit format Alertmanager reads too
    am_config = write_yaml(tmp_path / "alertmanager.yml", {"route": {"receiver": "null"},
                                                           "receivers": [{"name": "null"}]})
    with Alertmanager(tmp_path / "am", am_config, web_config=web, tls=context(pki),
                      headers=basic("prometheus", PASSWORD)) as am:
        password_file = tmp_path / "password"
        password_file.write_text(PASSWORD + "\n")
        c = pki["client"]
        scenario = write_yaml(tmp_path / "scenario.yaml", {"faults": [{"gpu": 1, "kind": "xid", "code": 48,
                                                                       "at_s": 1}]})
        config = write_yaml(tmp_path / "agent.yaml", {"alerting": {"alertmanager": {
            "urls": [am.base_url], "resend_interval_s": 1,
            "tls_config": {"ca_file": str(pki["ca"].path), "cert_file": str(c.cert), "key_file": str(c.key)},
            "basic_auth": {"username": "prometheus", "password_file": str(password_file)}}}})
        with AgentProcess(["--sim", "2", "--sim-scenario", scenario, "--config", config, "--node-name", "n1"],
                          tmp_path / "agent") as agent:
            alerts = wait_until(lambda: [a for a in am.alerts() if a["labels"]["alertname"] == "GpuXidCritical"],
                                timeout=30, what="the XID alert in Alertmanager", describe=agent.describe)
            assert alerts[0]["labels"]["xid"] == "48" and alerts[0]["labels"]["node"] == "n1"
        # A wrong password is refused by Alertmanager: the agent says so and counts it, never crashes.
        password_file.write_text("wrong\n")
        with AgentProcess(["--sim", "2", "--sim-scenario", scenario, "--config", config, "--node-name", "n2"],
                          tmp_path / "agent2") as agent:
            wait_until(lambda: "401" in agent.stderr_path.read_text(), timeout=30,
                       what="the agent logs Alertmanager's 401", describe=agent.describe)
