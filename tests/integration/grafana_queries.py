"""Run Grafana panel and variable queries against a real Prometheus the way Grafana's Prometheus data source does.

Variable interpolation follows Grafana's Prometheus data source: a single value is inserted as is (with
backslashes and quotes escaped for the string literal), a multi-value or "All" selection becomes
`(v1|v2|…)` with each value's regex metacharacters escaped twice (once for the regex, once for the PromQL
string). `label_values(metric, label)` is answered by `/api/v1/label/<label>/values?match[]=metric`, and
`label_values(label)` without a metric by `/api/v1/label/<label>/values`, as Grafana does. Built-in interval
variables get values fit for a 1 s scrape interval.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from tests.integration.helpers import PrometheusServer, http_get

_REGEX_SPECIAL = re.compile(r"[$^*{}\[\]'+?.()|]")
# $__rate_interval is max(4 × scrape interval, $__interval + scrape interval) in Grafana: 4 s at a 1 s scrape.
# 15 s keeps rate() windows populated on a machine where scrapes jitter.
BUILTINS = {"__rate_interval": "15s", "__interval": "1s", "__range": "60s", "__range_s": "60"}
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<metric>.+?)\s*,\s*)?(?P<label>[A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")
_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def _regular_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _special_regex_escape(value: str) -> str:
    return _REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(0), value.replace("\\", "\\\\\\\\"))


def interpolate(expr: str, variables: Mapping[str, Sequence[str] | str]) -> str:
    """`expr` with `$var`, `${var}` and `[[var]]` replaced as Grafana's Prometheus data source would."""
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name in BUILTINS:
            return BUILTINS[name]
        if name not in variables:
            if name.isdigit():
                return m.group(0)  # `$1` in label_replace: Grafana leaves what is not a variable alone
            raise KeyError(f"query uses ${name}, which is not a dashboard variable: {expr}")
        v = variables[name]
        if isinstance(v, str):
            return _regular_escape(v)
        if len(v) == 1:
            return _regular_escape(v[0])
        return "(" + "|".join(_special_regex_escape(x) for x in v) + ")"
    return _VAR.sub(sub, expr)


def variable_values(prom: PrometheusServer, query: str) -> list[str]:
    """A query variable's options: label_values(...) through the labels API, else an instant query's values."""
    m = _LABEL_VALUES.match(query)
    if m is None:
        raise ValueError(f"unsupported variable query (use label_values): {query}")
    params: list[tuple[str, str]] = []
    if m.group("metric"):
        params.append(("match[]", m.group("metric")))
    url = f"{prom.base_url}/api/v1/label/{m.group('label')}/values"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    status, _, body = http_get(url)
    payload = json.loads(body)
    assert status == 200 and payload.get("status") == "success", f"variable query {query!r} failed: {body[:300]!r}"
    return sorted(payload["data"])


def query_range(prom: PrometheusServer, expr: str, *, window_s: float = 60.0, step_s: float = 2.0) -> list[dict[str, Any]]:
    """A range query over the last `window_s` seconds (what a time-series panel asks); fails on a parse error."""
    end = time.time()
    start = end - math.ceil(window_s / step_s) * step_s  # a whole number of steps: the last one is `end`
    url = f"{prom.base_url}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"})
    status, _, body = http_get(url)
    payload = json.loads(body)
    assert status == 200 and payload.get("status") == "success", f"query {expr!r} failed ({status}): {body[:500]!r}"
    return list(payload["data"]["result"])
