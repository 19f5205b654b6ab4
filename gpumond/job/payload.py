"""Encode queued step records as one push body, in the contract's shape."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from math import isfinite

# A queued record, as the training thread appends it (plain tuple: cheapest to build):
# (step, end on the monotonic clock, duration_s, data_wait_s, samples or None[, comm_wait_s]).
# comm_wait_s is appended only when the step measured it, so a job that never does queues, and
# pushes, exactly what it did before the field existed (older services ignore it either way).
Record = tuple[int, float, float, float, "int | None"] | tuple[int, float, float, float, "int | None", float]

# Steps are formatted directly rather than through dicts and json.dumps: three times faster, and this
# runs on the push thread, which shares the GIL with training. Microsecond resolution is plenty.
_STEP = '{"step":%d,"end":%.6f,"duration_s":%.6f,"data_wait_s":%.6f,"samples":%s}'
_STEP_COMM = '{"step":%d,"end":%.6f,"duration_s":%.6f,"data_wait_s":%.6f,"samples":%s,"comm_wait_s":%.6f}'
# The service allows data_wait_s + comm_wait_s to exceed duration_s by 1 µs; rounding the three to
# 6 decimals can add up to 1.5 µs, so comm wait is kept 1 µs clear of the step's end before rounding.
_ROUNDING_S = 1e-6


def encode_head(head: Mapping[str, object]) -> str:
    """The fixed fields as the opening of a JSON object, encoded once per reporter."""
    return json.dumps(dict(head), separators=(",", ":"), ensure_ascii=False)[:-1] + ',"steps":['


def encode(head: str, records: Sequence[Record], wall_now: float, mono_now: float, *, final: bool = False) -> bytes:
    """The JSON body for `records`; step ends are mapped from the monotonic clock to unix time now.

    No records is a heartbeat (the process lives and has nothing to report); `final` marks the rank's
    last push (its process is ending)."""
    # Mapping at push time rather than per step keeps time.time() off the hot path, and an NTP
    # step between pushes shifts only the pushes after it.
    offset = wall_now - mono_now
    parts = []
    for record in records:
        if len(record) == 5:
            step, end, duration, wait, samples = record
            comm = None
        else:
            step, end, duration, wait, samples, comm = record
        end += offset
        if not (isfinite(end) and isfinite(duration) and isfinite(wait)):
            raise ValueError(f"step {step} has a non-finite time")
        count = "null" if samples is None else "%d" % samples
        if comm is None:
            parts.append(_STEP % (step, end, duration, wait, count))
        else:
            parts.append(_STEP_COMM % (step, end, duration, wait, count, _fit_comm_wait(comm, duration, wait)))
    return (head + ",".join(parts) + ("],\"final\":true}" if final else "]}")).encode()


def _fit_comm_wait(comm: float, duration: float, wait: float) -> float:
    """Comm wait cut to what the step leaves after its data wait, so the service never refuses the push.

    It can exceed that by clock rounding, or when it was measured between steps (it then counts toward
    the next step, which a fetch opens only later). Never negative; NaN becomes 0.
    """
    room = duration - wait - _ROUNDING_S
    comm = min(comm, room)  # min(nan, x) is nan: caught below
    return comm if comm > 0.0 else 0.0
