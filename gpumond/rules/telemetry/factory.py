"""Build the configured telemetry source from the rules config's `telemetry` section."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpumond.job.tlsclient import ClientTLS
from gpumond.rules.telemetry import promql, scrape
from gpumond.rules.telemetry.access import Access, AccessError
from gpumond.rules.telemetry.promql import PrometheusSource
from gpumond.rules.telemetry.scrape import ScrapeSource
from gpumond.rules.types import TelemetrySource


def build_source(telemetry: Any) -> TelemetrySource | None:
    """`prometheus` when it has a url, else `scrape` when it has targets or file_sd, else None.

    Accepts a plain mapping or any object with the same attributes (the pydantic model), so the
    shape `{scrape: {targets, file_sd, timeout_s, …}, prometheus: {url, timeout_s, lookback_s, …}}`
    is the only contract.
    """
    if telemetry is None:
        return None
    prom = _get(telemetry, "prometheus")
    url = _get(prom, "url")
    if url:
        return PrometheusSource(
            str(url),  # a pydantic URL type stringifies to the URL
            timeout_s=_number(prom, "timeout_s", promql.DEFAULT_TIMEOUT_S),
            lookback_s=_number(prom, "lookback_s", promql.DEFAULT_LOOKBACK_S),
            access=build_access(prom),
        )
    spec = _get(telemetry, "scrape")
    targets = [str(t) for t in (_get(spec, "targets") or ())]
    file_sd = _get(spec, "file_sd")
    if targets or file_sd:
        return ScrapeSource(
            targets,
            file_sd=Path(file_sd) if file_sd else None,
            timeout_s=_number(spec, "timeout_s", scrape.DEFAULT_TIMEOUT_S),
            scheme=str(_get(spec, "scheme") or "http"),
            access=build_access(spec),
        )
    return None


def build_access(spec: Any) -> Access:
    """A source's `tls_config`, `basic_auth` and `authorization`; AccessError (one line) on a bad file."""
    tls_cfg, basic, authz = (_get(spec, k) for k in ("tls_config", "basic_auth", "authorization"))
    tls = None
    if tls_cfg is not None:
        try:
            tls = ClientTLS(_get(tls_cfg, "ca_file"), _get(tls_cfg, "cert_file"), _get(tls_cfg, "key_file"),
                            insecure_skip_verify=bool(_get(tls_cfg, "insecure_skip_verify")))
        except ValueError as e:
            raise AccessError(f"tls_config: {e}") from None
    password_file, token_file = _get(basic, "password_file"), _get(authz, "credentials_file")
    access = Access(tls=tls, username=_get(basic, "username"),
                    password_file=Path(password_file) if password_file else None,
                    token_file=Path(token_file) if token_file else None)
    access.headers()  # a missing secret file is a config error at start, not a failing scrape later
    return access


def _get(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _number(obj: Any, name: str, default: float) -> float:
    value = _get(obj, name)
    return default if value is None else float(value)
