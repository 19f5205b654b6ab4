"""Encode queued step records as one push body, in the contract's shape."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from math import isfinite

# A queued record, as the training thread appends it (plain tuple: cheapest to build):
# (step, end on the monotonic clock, duration_s, data_wait_s, samples or None)
Record = tuple[int, float, float, float, "int | None"]

# Steps are formatted directly rather than through dicts and json.dumps: three times faster, and this
# runs on the push thread, which shares the GIL with training. Microsecond resolution is plenty.
_STEP = '{"step":%d,"end":%.6f,"duration_s":%.6f,"data_wait_s":%.6f,"samples":%s}'


def encode_head(head: Mapping[str, object]) -> str:
    """The fixed fields as the opening of a JSON object, encoded once per reporter."""
    return json.dumps(dict(head), separators=(",", ":"), ensure_ascii=False)[:-1] + ',"steps":['


def encode(head: str, records: Sequence[Record], wall_now: float, mono_now: float) -> bytes:
    """The JSON body for `records`; step ends are mapped from the monotonic clock to unix time now."""
    # Mapping at push time rather than per step keeps time.time() off the hot path, and an NTP
    # step between pushes shifts only the pushes after it.
    offset = wall_now - mono_now
    parts = []
    for step, end, duration, wait, samples in records:
        end += offset
        if not (isfinite(end) and isfinite(duration) and isfinite(wait)):
            raise ValueError(f"step {step} has a non-finite time")
        parts.append(_STEP % (step, end, duration, wait, "null" if samples is None else "%d" % samples))
    return (head + ",".join(parts) + "]}").encode()
