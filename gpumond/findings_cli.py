"""`gpumond findings`: the rules service's current findings as a terminal table (stdlib only)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

COLUMNS = ("KIND", "STATE", "JOB", "NODE", "RANK", "GPU", "SCORE", "SINCE", "EVIDENCE")


class FetchError(RuntimeError):
    """The rules service could not be asked; the message says where and why."""


def fetch(url: str, filters: Mapping[str, str], timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """GET {url}/api/v1/findings with filters; raises FetchError with one line."""
    query = urllib.parse.urlencode({k: v for k, v in filters.items() if v})
    full = url.rstrip("/") + "/api/v1/findings" + (f"?{query}" if query else "")
    try:
        with urllib.request.urlopen(full, timeout=timeout_s) as resp:  # noqa: S310 - operator-given URL
            body = json.load(resp)
    except urllib.error.HTTPError as e:
        raise FetchError(f"{full}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise FetchError(f"cannot reach {full}: {reason} (is `gpumond rules` running? set --url)") from None
    except json.JSONDecodeError:
        raise FetchError(f"{full}: the answer is not JSON (is this a gpumond rules service?)") from None
    return list(body.get("findings", []))


def _ago(since: float | None, now: float) -> str:
    if since is None:
        return "-"
    s = max(0, int(now - since))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _evidence(ev: Mapping[str, Any], width: int = 60) -> str:
    parts = []
    signals = ev.get("signals")
    if isinstance(signals, Mapping):
        for name, sig in signals.items():
            if isinstance(sig, Mapping):
                parts.append(f"{name} {sig.get('value')} vs {sig.get('peer_median')}")
    for key in ("data_wait_frac", "likely_cause", "slowdown", "stalled_for_s", "median_data_wait_frac",
                "gpus_flagged"):
        if key in ev:
            parts.append(f"{key}={ev[key]}")
    text = "; ".join(parts)
    return text if len(text) <= width else text[: width - 1] + "…"


def table(findings: Sequence[Mapping[str, Any]], now: float | None = None) -> str:
    """Findings as aligned text columns, firing first."""
    now = time.time() if now is None else now
    rows = [COLUMNS]
    for f in sorted(findings, key=lambda f: (f.get("state") != "firing", -float(f.get("score") or 0))):
        uuid = f.get("gpu_uuid") or "-"
        rows.append((str(f.get("kind")), str(f.get("state")), str(f.get("job")), f.get("node") or "-",
                     "-" if f.get("rank") is None else str(f.get("rank")),
                     uuid if len(uuid) <= 16 else uuid[:15] + "…", f"{float(f.get('score') or 0):.2f}",
                     _ago(f.get("since"), now), _evidence(f.get("evidence") or {})))
    if len(rows) == 1:
        return "no findings"
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
