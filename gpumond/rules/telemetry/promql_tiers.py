"""Which queries a fetch runs: what changes rarely is asked in full once per refresh, and reused in between.

At fleet scale a fetch's cost is series scanned on the server and decoded here (benchmarks/fleet_scale.py: a
VictoriaMetrics spends ~11 µs of CPU per series an instant query selects, even when a filter returns none of
them). Every signal a detector reads stays fresh each fetch. What changes rarely is asked in full at most every
`refresh_s` and its rows reused until then:

- the GPUs' identity (`gpumond_gpu_info` over the lookback), which also names the targets whose `up` is asked:
  in between, `up` of those jobs only, every fetch (a target going down is still seen at once);
- MIG devices (`gpumond_gpu_mig_info`), the max SM clock and the enforced power limit;
- the throttle reasons: in full at a refresh (which GPUs export which reason), in between only the active ones
  (`… != 0`), every fetch; a reason the refresh saw and the fetch does not return is inactive.

A live GPU (gpumond_gpu_up 1) that the kept identity, max clocks, power limits or throttle reasons lack (a node
that joined; an answer from before the server had indexed all its series) makes the next fetch a refresh: what
it lacks is missing for one fetch at most. A fleet whose agents do not export one of these for some GPU
therefore asks everything in full every fetch: correct, without the saving.

A refresh query that fails drops its cached rows (the signal is missing, and its error is in `errors`, as
without tiers) and is asked again by the next fetch: an old answer is never passed off as a new one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpumond.rules.telemetry import signals
from gpumond.rules.telemetry.promql_join import IDENTITY, TARGETS, Row

SM_CLOCK_MAX = signals.GPU_SERIES["sm_clock_max_hz"][0]
POWER_LIMIT = signals.GPU_SERIES["power_limit_w"][0]
# Asked in full only at a refresh; their rows are reused until the next one.
REUSED = (IDENTITY, signals.MIG_INFO, SM_CLOCK_MAX, POWER_LIMIT)
# Asked every fetch, in full at a refresh and in a cheaper form in between.
NARROWED = (TARGETS, signals.CLOCKS_EVENT)
REFRESHED = REUSED + NARROWED
# Kept answers with a row per GPU: a live GPU missing from one makes the next fetch a refresh.
_PER_GPU = (IDENTITY, SM_CLOCK_MAX, POWER_LIMIT, signals.CLOCKS_EVENT)
_REGEX_SPECIAL = set("\\.+*?()|[]{}^$")


class Tiers:
    """The queries of each fetch and the rows kept from the last refresh; one per source, used by one thread."""

    def __init__(self, full: Mapping[str, str], refresh_s: float) -> None:
        if refresh_s < 0:
            raise ValueError("refresh_s must be >= 0 (0 asks everything in full every fetch)")
        self._full = dict(full)
        self._refresh_s = float(refresh_s)
        self._kept: dict[str, tuple[float, Sequence[Row]]] = {}  # key → (evaluation time of its refresh, rows)
        self._inactive: tuple[tuple[Row, ...], dict[tuple[str | None, str | None], int]] = ((), {})
        self._covered: tuple[tuple[float | None, ...], frozenset[str | None]] = ((), frozenset())

    def plan(self, t: float) -> dict[str, str]:
        """The queries to run at evaluation time `t`, keyed as join expects."""
        out = {}
        for key, query in self._full.items():
            if key not in REFRESHED or self._due(key, t):
                out[key] = query
            elif key == TARGETS:
                out[key] = _up_of(self._kept[IDENTITY][1])
            elif key == signals.CLOCKS_EVENT:
                out[key] = f"{query} != 0"
        return out

    def merge(self, asked: Mapping[str, str], results: Mapping[str, Sequence[Row]],
              t: float) -> dict[str, Sequence[Row]]:
        """The results of the queries `plan(t)` returned (a failed one missing), completed with the kept rows."""
        out: dict[str, Sequence[Row]] = dict(results)
        for key in REFRESHED:
            if key not in self._full:
                continue
            full = asked.get(key) == self._full[key]
            if full:  # asked in full: keep what it answered, or forget what the last refresh said
                if key in results:
                    self._kept[key] = (t, results[key])
                    if key == signals.CLOCKS_EVENT:
                        self._inactive = _inactive(results[key])
                else:
                    self._kept.pop(key, None)
            elif key in REUSED:
                out[key] = self._kept[key][1]
            elif key == signals.CLOCKS_EVENT and key in results:
                out[key] = _active_over(self._inactive, results[key])
        if IDENTITY in self._kept and not self._covers(results.get(signals.GPU_UP, ())):
            self._kept.clear()  # a live GPU the refresh did not fully see: the next fetch asks everything in full
        return out

    def _covers(self, gpu_up: Sequence[Row]) -> bool:
        """Whether every live GPU has its rows in each kept answer about GPUs (identity, limits, throttle)."""
        stamp = tuple(self._kept[k][0] if k in self._kept else None for k in _PER_GPU)
        if self._covered[0] != stamp:
            sets = [frozenset(r.labels.get("uuid") for r in self._kept[k][1]) for k in _PER_GPU if k in self._kept]
            self._covered = (stamp, frozenset.intersection(*sets))
        return all(r.labels.get("uuid") in self._covered[1] for r in gpu_up if r.value == 1)

    def _due(self, key: str, t: float) -> bool:
        if key == TARGETS:  # `up` of every target that exports an identity: asked with the identity
            key = IDENTITY
        kept = self._kept.get(key)
        # A clock that went back (a test's, a corrected one) refreshes too: the kept rows may be from its future.
        return kept is None or not 0 <= t - kept[0] < self._refresh_s or (key == IDENTITY and not _jobs(kept[1]))


def _inactive(known: Sequence[Row]) -> tuple[tuple[Row, ...], dict[tuple[str | None, str | None], int]]:
    """Each throttle series a refresh saw at 0, and where each (uuid, reason) is among them: made once per refresh
    (~170,000 series at 33,000 GPUs), copied by the fetches in between."""
    rows = tuple(Row(r.labels, 0.0) for r in known)
    return rows, {_reason_key(r): i for i, r in enumerate(rows)}


def _active_over(inactive: tuple[tuple[Row, ...], dict[tuple[str | None, str | None], int]],
                 active: Sequence[Row]) -> list[Row]:
    """Every throttle series the refresh saw, 0 unless the fetch's `!= 0` query returned it; plus any new one."""
    zeros, where = inactive
    out = list(zeros)
    for row in active:
        i = where.get(_reason_key(row))
        if i is None:
            out.append(row)
        else:
            out[i] = row
    return out


def _reason_key(row: Row) -> tuple[str | None, str | None]:
    return row.labels.get("uuid"), row.labels.get("reason")


def _jobs(identity: Sequence[Row]) -> list[str]:
    return sorted({r.labels.get("job", "") for r in identity} - {""})


def _up_of(identity: Sequence[Row]) -> str:
    """`up` of the jobs whose targets export an identity: a few series per node, whatever else the server holds."""
    jobs = "|".join(_regex_literal(j) for j in _jobs(identity))
    return f'up{{job=~"{jobs}"}}'


def _regex_literal(text: str) -> str:
    """`text` matched literally by a PromQL regex inside a double-quoted string (RE2, then string escapes)."""
    escaped = "".join("\\" + c if c in _REGEX_SPECIAL else c for c in text)
    return escaped.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
