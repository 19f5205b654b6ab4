"""Which queries a fetch runs: what changes rarely is asked in full once per refresh, and reused in between.

At fleet scale a fetch's cost is series scanned on the server and decoded here (benchmarks/fleet_scale.py: a
VictoriaMetrics spends ~11 µs of CPU per series an instant query selects, even when a filter returns none of
them). Every signal a detector reads stays fresh each fetch. What changes rarely is asked in full at most every
`refresh_s` and its rows reused until then:

- the GPUs' identity (`gpumond_gpu_info` over the lookback), which also names the targets whose `up` is asked:
  in between, `up` of those jobs only, every fetch (a target going down is still seen at once);
- MIG devices (`gpumond_gpu_mig_info`), the max SM clock and the enforced power limit;
- the throttle reasons: in full at a refresh (which GPUs export which reason), in between only the active ones
  (`… != 0`), every fetch; a reason the refresh saw and the fetch does not return is inactive. They are asked as
  the agent's one bitmask series per GPU (signals.CLOCKS_EVENT_MASK, decoded into the same per-reason rows), and
  as the per-reason series (signals.CLOCKS_EVENT, 5 series a GPU, each costing the server as much as the
  bitmask) only while some live GPU lacks the bitmask: an older agent, or a server that drops the series. Where a
  GPU has both, the bitmask is read. The first fetch asks both; a refresh that finds every live GPU with a
  bitmask stops asking the per-reason series, and a live GPU without one (a node with an older agent joined)
  makes the next fetch a refresh that asks both again.

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
from gpumond.rules.telemetry.promql_join import IDENTITY, TARGETS, Row, mask_rows

SM_CLOCK_MAX = signals.GPU_SERIES["sm_clock_max_hz"][0]
POWER_LIMIT = signals.GPU_SERIES["power_limit_w"][0]
# Asked in full only at a refresh; their rows are reused until the next one.
REUSED = (IDENTITY, signals.MIG_INFO, SM_CLOCK_MAX, POWER_LIMIT)
# Asked every fetch, in full at a refresh and in a cheaper form in between.
MASK = signals.CLOCKS_EVENT_MASK
NARROWED = (TARGETS, signals.CLOCKS_EVENT, MASK)
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
        # Whether the per-reason throttle series are asked too: until a refresh finds every live GPU with a bitmask.
        self._per_reason = True
        self._masked: frozenset[str] = frozenset()  # the GPUs whose bitmask the last refresh read

    def plan(self, t: float) -> dict[str, str]:
        """The queries to run at evaluation time `t`, keyed as join expects."""
        out = {}
        for key, query in self._full.items():
            if key == signals.CLOCKS_EVENT and MASK in self._full and not self._per_reason:
                continue  # every live GPU exports the bitmask
            if key not in REFRESHED or self._due(key, t):
                out[key] = query
            elif key == TARGETS:
                out[key] = up_of(self._kept[IDENTITY][1])
            elif key in (signals.CLOCKS_EVENT, MASK):  # the throttle reasons: only the active ones
                out[key] = f"{query} != 0"
        return out

    def kept(self, key: str) -> Sequence[Row] | None:
        """The rows of `key` (one of REUSED) the last refresh kept; None when it has none."""
        kept = self._kept.get(key)
        return kept[1] if kept is not None else None

    def merge(self, asked: Mapping[str, str], results: Mapping[str, Sequence[Row]],
              t: float) -> dict[str, Sequence[Row]]:
        """The results of the queries `plan(t)` returned (a failed one missing), completed with the kept rows."""
        out: dict[str, Sequence[Row]] = dict(results)
        for key in REUSED + (TARGETS,):
            if key not in self._full:
                continue
            full = asked.get(key) == self._full[key]
            if full:  # asked in full: keep what it answered, or forget what the last refresh said
                if key in results:
                    self._kept[key] = (t, results[key])
                else:
                    self._kept.pop(key, None)
            elif key in REUSED:
                out[key] = self._kept[key][1]
        self._merge_throttle(asked, results, out, t)
        if IDENTITY in self._kept and not self._covers(results.get(signals.GPU_UP, ())):
            self._kept.clear()  # a live GPU the refresh did not fully see: the next fetch asks everything in full
            self._per_reason = True
        return out

    def _merge_throttle(self, asked: Mapping[str, str], results: Mapping[str, Sequence[Row]],
                        out: dict[str, Sequence[Row]], t: float) -> None:
        """out[CLOCKS_EVENT]: per-reason rows from the bitmask and the per-reason answers (bitmask first); missing
        when a throttle query asked failed. The per-reason rows of every GPU are kept at a refresh."""
        throttle = [k for k in (MASK, signals.CLOCKS_EVENT) if k in asked]
        out.pop(MASK, None)
        if not throttle:
            return
        answered = all(k in results for k in throttle)
        full = asked[throttle[0]] == self._full[throttle[0]]
        rows, have = throttle_rows(results.get(MASK, ()), results.get(signals.CLOCKS_EVENT, ()),
                                   frozenset() if full else self._masked)
        if full:
            if answered:
                self._kept[signals.CLOCKS_EVENT] = (t, rows)
                self._inactive = _inactive(rows)
            else:
                self._kept.pop(signals.CLOCKS_EVENT, None)
            self._masked = have
            if MASK in self._full:
                self._per_reason = MASK not in results or not all(
                    r.labels.get("uuid") in have for r in results.get(signals.GPU_UP, ()) if r.value == 1)
            if any(k in results for k in throttle):
                out[signals.CLOCKS_EVENT] = rows
            else:
                out.pop(signals.CLOCKS_EVENT, None)
        elif answered:
            out[signals.CLOCKS_EVENT] = _active_over(self._inactive, rows)
        else:
            out.pop(signals.CLOCKS_EVENT, None)

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
        elif key == MASK:  # the throttle reasons, however asked, are kept as one answer
            key = signals.CLOCKS_EVENT
        kept = self._kept.get(key)
        # A clock that went back (a test's, a corrected one) refreshes too: the kept rows may be from its future.
        return kept is None or not 0 <= t - kept[0] < self._refresh_s or (key == IDENTITY and not _jobs(kept[1]))


def throttle_rows(mask: Sequence[Row], per_reason: Sequence[Row],
                  masked: frozenset[str] = frozenset()) -> tuple[list[Row], frozenset[str]]:
    """The CLOCKS_EVENT rows of one fetch: each bitmask decoded, and the per-reason series of the GPUs without one
    (here, or in `masked`: the GPUs whose bitmask a refresh read); with the GPUs the bitmasks covered."""
    decoded = mask_rows(mask)
    have = frozenset(r.labels["uuid"] for r in decoded) | masked
    return decoded + [r for r in per_reason if r.labels.get("uuid") not in have], have


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


def up_of(identity: Sequence[Row]) -> str:
    """`up` of the jobs whose targets export an identity: a few series per node, whatever else the server holds."""
    jobs = "|".join(regex_literal(j) for j in _jobs(identity))
    return f'up{{job=~"{jobs}"}}'


def regex_literal(text: str) -> str:
    """`text` matched literally by a PromQL regex inside a double-quoted string (RE2, then string escapes)."""
    escaped = "".join("\\" + c if c in _REGEX_SPECIAL else c for c in text)
    return escaped.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
