"""The web config file (gpumond/web/config.py, gpumond/web/__init__.py): exporter-toolkit's shape, what gpumond
refuses and why, paths relative to the file, and one line for each bad certificate at start."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gpumond.config.errors import ConfigError
from gpumond.web.config import WebConfig, load_web_config
from gpumond.job.settings import ConfigError as SdkConfigError
from gpumond.job.settings import resolve_tls
from gpumond.web import load_web
from tests.pki import CA

REPO = Path(__file__).resolve().parents[2]
HASH = "$2y$10$oemgtPFV10zn124SFMK5BOiu3IwhF866pYZ6oC1kwCDlapQyvRILS"


def write(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def problem(tmp_path: Path, data: object) -> str:
    with pytest.raises(ConfigError) as caught:
        load_web_config(write(tmp_path / "web.yml", data))
    return caught.value.problem


def tls(**extra: object) -> dict:
    return {"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key", **extra}}


@pytest.mark.parametrize("extra, expected", [
    ({"client_auth_type": "RequireAnyClientCert", "client_ca_file": "ca.crt"},
     "RequireAnyClientCert (a client certificate that is not verified) is not supported by gpumond"),
    ({"client_auth_type": "RequestClientCert", "client_ca_file": "ca.crt"}, "RequestClientCert"),
    ({"client_auth_type": "Mutual"}, "must be one of NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert"),
    ({"client_auth_type": "RequireAndVerifyClientCert"}, "needs client_ca_file"),
    ({"client_ca_file": "ca.crt"}, "client_ca_file is set but client_auth_type is NoClientCert"),
    ({"min_version": "TLS11"}, "TLS11 is refused; gpumond serves TLS 1.2 and 1.3 only"),
    ({"cipher_suites": ["TLS_AES_128_GCM_SHA256"]}, "cipher_suites: not supported by gpumond"),
    ({"client_allowed_sans": ["a"]}, "client_allowed_sans: not supported by gpumond"),
    ({"min_version": "TLS13", "max_version": "TLS12"}, "max_version TLS12 is below min_version TLS13"),
    ({"cert_fil": "x"}, "cert_fil"),
])
def test_what_gpumond_refuses_is_one_line_naming_the_key(tmp_path, extra, expected) -> None:
    line = problem(tmp_path, tls(**extra))
    assert expected in line and "\n" not in line, line


def test_http_server_config_and_plain_passwords_are_refused(tmp_path) -> None:
    assert "http_server_config: not supported by gpumond" in problem(tmp_path, {"http_server_config": {"http2": False}})
    line = problem(tmp_path, {"basic_auth_users": {"alice": "hunter2"}})
    assert "user 'alice': the value must be a bcrypt hash" in line and "hunter2" not in line


def test_relative_paths_are_read_from_the_files_directory_and_an_empty_file_is_plain_http(tmp_path) -> None:
    cfg = load_web_config(write(tmp_path / "web.yml", tls(client_auth_type="RequireAndVerifyClientCert",
                                                          client_ca_file="/abs/ca.crt")))
    t = cfg.tls_server_config
    assert (t.cert_file, t.key_file, t.client_ca_file) == (tmp_path / "tls.crt", tmp_path / "tls.key",
                                                           Path("/abs/ca.crt"))
    (tmp_path / "empty.yml").write_text("")
    web = load_web(tmp_path / "empty.yml")
    assert web.tls is None and web.scheme == "http" and web.wrap(app := object(), ()) is app


def test_the_shipped_example_and_the_docs_example_are_valid(tmp_path) -> None:
    WebConfig.model_validate(yaml.safe_load((REPO / "deploy/examples/web-config.yml").read_text()))
    doc = (REPO / "docs/configuration.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", doc, flags=re.DOTALL) if "tls_server_config" in b)
    cfg = WebConfig.model_validate(yaml.safe_load(block.replace("/etc/gpumond/read-tokens", str(tmp_path / "t"))))
    import bcrypt
    assert bcrypt.checkpw(b"example-change-me", cfg.basic_auth_users["prometheus"].encode())


def test_bad_certificates_are_one_line_each(tmp_path) -> None:
    ca = CA(tmp_path)
    good, other = ca.issue("tls"), ca.issue("other")

    def line(cert: Path, key: Path, **extra: object) -> str:
        web = write(tmp_path / "web.yml", {"tls_server_config": {"cert_file": str(cert), "key_file": str(key),
                                                                 **extra}})
        with pytest.raises(ConfigError) as caught:
            load_web(web)
        assert str(caught.value).startswith(f"{web}: ") and "\n" not in str(caught.value)
        return caught.value.problem

    assert line(good.cert, other.key) == (f"tls_server_config: the key in {other.key} does not belong to the "
                                          f"certificate in {good.cert} (give the key the certificate was issued for)")
    assert line(tmp_path / "nope.crt", good.key) == f"tls_server_config.cert_file: cannot read {tmp_path / 'nope.crt'}: no such file"
    assert "client_ca_file" in line(good.cert, good.key, client_auth_type="RequireAndVerifyClientCert",
                                    client_ca_file=str(good.key))  # a key is not a CA certificate
    tokens = tmp_path / "tokens"
    tokens.write_text("short\n")
    web = write(tmp_path / "web.yml", {"bearer_tokens_file": str(tokens)})
    with pytest.raises(ConfigError, match="bearer_tokens_file: .* line 1: must be 16-512 characters"):
        load_web(web)


def test_the_sdk_reads_its_tls_files_from_the_environment_and_names_a_bad_one(tmp_path) -> None:
    ca = CA(tmp_path)
    client = ca.issue("client", client=True)
    assert resolve_tls(None, None, None, {}) is None
    tls = resolve_tls(None, None, None, {"GPUMOND_CA_FILE": str(ca.path), "GPUMOND_CLIENT_CERT_FILE": str(client.cert),
                                         "GPUMOND_CLIENT_KEY_FILE": str(client.key)})
    assert tls is not None and tls.context.minimum_version.name == "TLSv1_2"
    with pytest.raises(SdkConfigError, match="needs both GPUMOND_CLIENT_CERT_FILE and GPUMOND_CLIENT_KEY_FILE"):
        resolve_tls(None, str(client.cert), None, {})
    with pytest.raises(SdkConfigError, match=f"CA file {tmp_path / 'missing.crt'}: no such file"):
        resolve_tls(str(tmp_path / "missing.crt"), None, None, {})
    other = ca.issue("other", client=True)
    with pytest.raises(SdkConfigError, match="the key .* does not belong to it"):
        resolve_tls(None, str(client.cert), str(other.key), {})


def test_check_config_loads_the_web_config_and_its_certificates(tmp_path) -> None:
    import subprocess
    import sys

    ca = CA(tmp_path)
    good, other = ca.issue("tls"), ca.issue("other")
    web = write(tmp_path / "web.yml", {"tls_server_config": {"cert_file": str(good.cert), "key_file": str(good.key),
                                                              "client_auth_type": "RequireAndVerifyClientCert",
                                                              "client_ca_file": str(ca.path)}})
    agent = write(tmp_path / "agent.yaml", {"web_config_file": str(web), "state_dir": str(tmp_path)})

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpumond.cli", "check-config", "--kind", "agent", str(agent)],
                              capture_output=True, text=True, timeout=60)

    ok = check()
    assert ok.returncode == 0 and "; serves TLS, RequireAndVerifyClientCert; full check" in ok.stdout, ok
    good.key.write_bytes(other.key.read_bytes())  # a key that is not the certificate's
    bad = check()
    assert bad.returncode == 2 and "does not belong to the certificate" in bad.stderr, bad
    assert len(bad.stderr.strip().splitlines()) == 1
    expired = ca.issue("tls", expired=True)  # a matching pair, past its not-after
    expired_check = check()
    assert expired_check.returncode == 2 and f"the certificate in {expired.cert} expired on" in expired_check.stderr
    assert len(expired_check.stderr.strip().splitlines()) == 1, expired_check


@pytest.mark.parametrize("when, said", [("expired", "expired on"), ("not_yet_valid", "is not valid until")])
def test_a_certificate_outside_its_dates_is_refused_with_one_line(tmp_path, when: str, said: str) -> None:
    bad = CA(tmp_path).issue("tls", **{when: True})
    web = write(tmp_path / "web.yml", {"tls_server_config": {"cert_file": str(bad.cert), "key_file": str(bad.key)}})
    with pytest.raises(ConfigError) as caught:
        load_web(web)
    line = str(caught.value)
    assert "\n" not in line and f"tls_server_config.cert_file: the certificate in {bad.cert} {said}" in line, line
    assert "install a certificate valid now" in line, line


def test_the_served_certificate_s_expiry_is_a_metric(tmp_path) -> None:
    good = CA(tmp_path).issue("tls")
    web = write(tmp_path / "web.yml", {"tls_server_config": {"cert_file": str(good.cert), "key_file": str(good.key)}})
    [series] = load_web(web).series()
    assert (series.name, series.value) == ("gpumond_tls_certificate_not_after_timestamp_seconds", good.not_after)
    assert load_web(None).series() == []  # plain HTTP: no certificate, no series
