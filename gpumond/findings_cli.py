"""`gpumond findings`, and the read-API client it shares with `gpumond alerts`: base URLs, one JSON GET, tables.

Stdlib only, so both commands start fast and load nothing of the daemons.
"""

from __future__ import annotations

import http.client
import json
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpumond.wire.safetext import escape_unsafe
from gpumond.wire.tlsclient import explain, https_instead

# MEASURE: what made the finding, with its unit: each kind's `score` is a different quantity (a z-score
# against peers, a share of the step, a ratio to the job's baseline), so a bare number would not compare.
COLUMNS = ("KIND", "STATE", "JOB", "NODE", "RANK", "GPU", "MEASURE", "SINCE", "EVIDENCE")
RULES_URL = "http://127.0.0.1:9481"
# An answer bigger than this is not a findings or alerts list a terminal can use.
MAX_ANSWER_BYTES = 64 * 1024 * 1024



@dataclass(frozen=True)
class Access:
    """How to reach a daemon's read API: the TLS context (--ca-file, --cert-file) and the Authorization header
    (--username/--password-file or --token-file) its web config asks for; the default is plain and anonymous."""

    context: ssl.SSLContext | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def open(self, url: str, timeout_s: float) -> Any:
        request = urllib.request.Request(url, headers=dict(self.headers))
        return urllib.request.urlopen(request, timeout=timeout_s, context=self.context)  # noqa: S310 - http(s)


ANONYMOUS = Access()
# What a 401 from a daemon with read authentication (basic_auth_users / bearer tokens) asks for: credentials,
# or, when some were sent, other ones (telling a refused password from a missing one saves a wrong search).
_CREDENTIALS_HINT = (" (this daemon requires read credentials: --username with --password-file, or --token-file)")
_REFUSED_HINT = (" (this daemon refused the credentials given: check the user name, the first line of "
                 "--password-file or --token-file, and the daemon's basic_auth_users / bearer_tokens_file)")

# What an operator types when they forget the scheme: a host name or address, maybe a port.
_BARE_HOST = re.compile(r"(?:[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\])(?::(\d+))?/?")


class FetchError(RuntimeError):
    """A daemon could not be asked; the message says where, why and what to do."""


def base_url(text: str, default_port: int) -> str:
    """`text` checked as a daemon's base URL (http or https, a host); ValueError says what to type instead."""
    text = text.strip()
    if "://" not in text:
        bare = _BARE_HOST.fullmatch(text)
        if bare:
            hostport = text.rstrip("/") + ("" if bare.group(1) else f":{default_port}")
            raise ValueError(f"{text}: missing scheme; use http://{hostport}")
        raise ValueError(f"{text!r} is not an http:// or https:// URL; e.g. http://127.0.0.1:{default_port}")
    parts = urllib.parse.urlsplit(text)
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(f"{text}: scheme {parts.scheme!r} is not supported; use http:// or https://")
    if not parts.hostname:
        raise ValueError(f"{text}: no host; e.g. http://127.0.0.1:{default_port}")
    if any(c.isspace() for c in text):
        raise ValueError(f"{text!r}: a URL cannot contain spaces")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError(f"{text}: the port must be a number from 1 to 65535")
    if parts.query or parts.fragment:
        raise ValueError(f"{text}: give the base URL only, without '?' or '#'")
    return text.rstrip("/")


def get_json(base: str, path: str, key: str, *, daemon: str, query: Mapping[str, str | None] | None = None,
             timeout_s: float = 5.0, access: Access = ANONYMOUS) -> list[dict[str, Any]]:
    """GET {base}{path}?{query} and return the list under `key`; raises FetchError with one line.

    `daemon` names what should answer there (for the hint), e.g. "the rules service (`gpumond rules`)";
    `access` verifies an https daemon, presents a client certificate and the read credentials.
    """
    encoded = urllib.parse.urlencode({k: v for k, v in (query or {}).items() if v})
    full = base.rstrip("/") + path + (f"?{encoded}" if encoded else "")
    try:
        with access.open(full, timeout_s) as resp:
            raw = resp.read(MAX_ANSWER_BYTES + 1)
    except urllib.error.HTTPError as e:
        raise FetchError(f"{full}: HTTP {e.code} {e.reason}{_error_detail(e)}"
                         + (f" (is {daemon} at {base}, in a version that serves {path}? check --url)"
                            if e.code == 404 else _credentials_hint(access) if e.code == 401 else "")) from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
        reason = getattr(e, "reason", None) or e or type(e).__name__
        # a handshake failure arrives inside URLError; a refusal read after it (TLS 1.3) as the SSLError itself
        tls = explain(e) or (explain(reason) if isinstance(reason, BaseException) else None)
        if tls is not None:
            raise FetchError(f"cannot reach {full}: {tls.replace('GPUMOND_CA_FILE for the job SDK', '--ca-file')}"
                             ) from None
        if (https := https_instead(e, base)) is not None:
            raise FetchError(f"cannot reach {full}: {reason} (if it serves TLS, use {https}; "
                             f"else is {daemon} running there?)") from None
        raise FetchError(f"cannot reach {full}: {reason} (is {daemon} running there? set --url)") from None
    except ValueError as e:  # a URL urllib still refuses (base_url() catches the usual mistakes first)
        raise FetchError(f"{full}: {e}") from None
    if len(raw) > MAX_ANSWER_BYTES:
        raise FetchError(f"{full}: the answer is larger than {MAX_ANSWER_BYTES // 1_048_576} MiB; narrow it down "
                         "with the filter flags")
    try:
        body = json.loads(raw)
    except ValueError:  # JSONDecodeError, or bytes that are not text
        raise FetchError(f"{full}: the answer is not JSON (is {daemon} serving at {base}?)") from None
    items = body.get(key) if isinstance(body, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise FetchError(f"{full}: the answer has no {key!r} list of objects (is {daemon} serving at {base}?)")
    return items


def _credentials_hint(access: Access) -> str:
    return _REFUSED_HINT if any(k.lower() == "authorization" for k in access.headers) else _CREDENTIALS_HINT


def _error_detail(err: urllib.error.HTTPError) -> str:
    """': <message>' from a gpumond error body {"error": "..."}, else nothing."""
    try:
        body = json.loads(err.read(4096))
    except (ValueError, OSError, http.client.HTTPException):
        return ""
    message = body.get("error") if isinstance(body, dict) else None
    return f": {message[:200]}" if isinstance(message, str) and message else ""


def render(columns: Sequence[str], rows: Sequence[Sequence[str]], empty: str) -> str:
    """Rows as left-aligned text columns under `columns`, or `empty` when there are none."""
    if not rows:
        return empty
    # A cell holds what a daemon answered (job and node names pushed by jobs): escape what could split a
    # row or reorder it on screen (gpumond.wire.safetext), before measuring widths.
    every = [tuple(columns), *([escape_unsafe(c) for c in r] for r in rows)]
    widths = [max(len(r[i]) for r in every) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in every)


def ago(since: float | None, now: float) -> str:
    """How long ago `since` (Unix seconds) was, as 4m05s or 2h07m; "-" when unknown."""
    if since is None:
        return "-"
    s = max(0, int(now - since))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def short(text: str, width: int) -> str:
    """`text` cut to `width` characters, an ellipsis marking the cut."""
    return text if len(text) <= width else text[: width - 1] + "…"


def fetch(url: str, filters: Mapping[str, str | None], timeout_s: float = 5.0,
          access: Access = ANONYMOUS) -> list[dict[str, Any]]:
    """The findings of the rules service at `url`, filtered there; raises FetchError with one line."""
    return get_json(url, "/api/v1/findings", "findings", daemon="the rules service (`gpumond rules`)",
                    query=filters, timeout_s=timeout_s, access=access)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _pct(value: Any) -> str:
    v = _num(value)
    return "?" if v is None else f"{v * 100:.0f}%"


def measure(finding: Mapping[str, Any]) -> str:
    """The finding's score in words with its unit, from the score and the evidence its kind carries."""
    kind, ev = finding.get("kind"), finding.get("evidence") or {}
    score = _num(finding.get("score"))
    shown = "?" if score is None else f"{score:.1f}"
    signals = ev.get("signals") if isinstance(ev.get("signals"), Mapping) else {}
    seq = signals.get("sequential") if kind == "straggler" and set(signals) == {"sequential"} else None
    if isinstance(seq, Mapping) and _num(seq.get("value")) is not None and _num(seq.get("span_s")) is not None:
        # Flagged on sequential evidence alone: its z is per step, not the group threshold's (detectors.md).
        return f"compute ×{_num(seq.get('value')):.2f} of peers for {_num(seq.get('span_s')):.0f} s"
    if kind in ("straggler", "straggler_node"):
        threshold = _num(ev.get("threshold_z"))
        text = f"z {shown} vs peers" + (f" (flags at {threshold:.1f})" if threshold is not None else "")
        if kind == "straggler_node" and "gpus_flagged" in ev:
            text += f", {ev.get('gpus_flagged')}/{ev.get('gpus_on_node', '?')} GPUs"
        return text
    if kind == "io_starved_rank":
        return f"data wait {_pct(ev.get('data_wait_frac'))} of step (peers {_pct(ev.get('peer_median_data_wait_frac'))})"
    if kind == "io_starved_job":
        ranks = f", {ev.get('ranks_starved')}/{ev.get('ranks')} ranks" if "ranks_starved" in ev else ""
        return f"data wait {_pct(ev.get('median_data_wait_frac', score))} of step (median){ranks}"
    if kind == "job_slowdown":
        return f"step time ×{_num(ev.get('slowdown')) or score or 0:.2f} of baseline"
    if kind == "hung_rank":
        stalled, limit = _num(ev.get("stalled_for_s")), _num(ev.get("limit_s"))
        if stalled is not None:
            return f"no step for {stalled:.0f} s" + (f" (limit {limit:.0f} s)" if limit is not None else "")
        return f"stalled ×{shown} of its limit"
    return f"score {shown}"


# Evidence keys MEASURE already shows, left out of the EVIDENCE column.
_IN_MEASURE = {"threshold_z", "gpus_flagged", "gpus_on_node", "data_wait_frac", "peer_median_data_wait_frac",
               "median_data_wait_frac", "ranks_starved", "ranks", "slowdown", "stalled_for_s", "limit_s"}


def _evidence(ev: Mapping[str, Any], width: int = 60) -> str:
    parts = []
    signals = ev.get("signals")
    if isinstance(signals, Mapping):
        for name, sig in signals.items():
            if isinstance(sig, Mapping):
                parts.append(f"{name} {sig.get('value')} vs {sig.get('peer_median')}")
    for key in ("likely_cause", "step_time_s", "baseline_step_time_s", "localised"):
        if key in ev and key not in _IN_MEASURE:
            parts.append(f"{key}={ev[key]}")
    return short("; ".join(parts), width)


def table(findings: Sequence[Mapping[str, Any]], now: float | None = None, empty: str = "no findings") -> str:
    """Findings as aligned text columns: firing first, then by kind, the strongest of a kind first (scores of
    different kinds are different quantities, so they are compared only within a kind)."""
    now = time.time() if now is None else now
    rows = []
    for f in sorted(findings, key=lambda f: (f.get("state") != "firing", str(f.get("kind")),
                                             -(_num(f.get("score")) or 0.0))):
        rows.append((str(f.get("kind")), str(f.get("state")), str(f.get("job")), f.get("node") or "-",
                     "-" if f.get("rank") is None else str(f.get("rank")), short(f.get("gpu_uuid") or "-", 16),
                     measure(f), ago(f.get("since"), now), _evidence(f.get("evidence") or {})))
    return render(COLUMNS, rows, empty)


def known(url: str, timeout_s: float = 5.0, access: Access = ANONYMOUS) -> str:
    """What the rules service holds, for a "no findings" line: jobs and ranks pushing, GPU telemetry.

    Read from its /metrics (`gpumond_rules_held`, `gpumond_rules_telemetry_up`); FetchError if unreadable.
    """
    full = url.rstrip("/") + "/metrics"
    try:
        with access.open(full, timeout_s) as resp:
            text = resp.read(MAX_ANSWER_BYTES).decode("utf-8", "replace")
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        raise FetchError(f"cannot read {full}: {getattr(e, 'reason', None) or e}") from None
    from prometheus_client.parser import text_string_to_metric_families  # only for this line: keep start fast

    held: dict[str, float] = {}
    telemetry: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "gpumond_rules_held":
                    held[s.labels.get("kind", "")] = s.value
                elif s.name == "gpumond_rules_telemetry_up":
                    telemetry[s.labels.get("source", "")] = s.value
    except ValueError as e:
        raise FetchError(f"{full}: not Prometheus text ({e})") from None
    jobs, ranks = int(held.get("jobs", 0)), int(held.get("ranks", 0))
    pushed = (f"{jobs} job(s) with {ranks} rank(s) pushing" if jobs else
              # held jobs only: a job that sent `final` or outlived expire_after_s is no longer counted
              "no job is pushing to it (none has yet, or each one ended or fell silent; check GPUMOND_ENDPOINT "
              "and GPUMOND_TOKEN in the training job)")
    if not telemetry:
        gpu = "no GPU telemetry source configured (telemetry: in rules.yaml)"
    else:
        source, up = next(iter(telemetry.items()))
        gpus, nodes = int(held.get("telemetry_gpus", 0)), int(held.get("telemetry_nodes", 0))
        gpu = (f"GPU telemetry ({source}) from {nodes} node(s), {gpus} GPU(s)" if up and gpus else
               f"GPU telemetry ({source}) configured but {'no GPU seen yet' if up else 'its last fetch failed'}")
    return f"{pushed}; {gpu}"

