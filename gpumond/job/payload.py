"""Encode queued step records as one push body, in the contract's shape: JSON step objects, or columns.

Two encodings (docs/rules-api.md): `json` (Content-Type application/json, a list of step objects, what every
rules service version reads) and `columns` (application/vnd.gpumond.columns+json, one base64 array of
little-endian 8-byte values per field, which the service decodes without an object per step: several times
less of its CPU per step; it needs a service that knows it).
"""

from __future__ import annotations

import base64
import json
import sys
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from math import isfinite, nan

from gpumond.wire.media import COLUMN_FIELDS

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
_OPENINGS = {"json": ',"steps":[', "columns": ',"columns":'}

Encoder = Callable[..., bytes]  # (head, records, wall_now, mono_now, *, final=False) -> body


def encode_head(head: Mapping[str, object], encoding: str = "json") -> str:
    """The fixed fields as the opening of a JSON object, encoded once per reporter."""
    return json.dumps(dict(head), separators=(",", ":"), ensure_ascii=False)[:-1] + _OPENINGS[encoding]


def encoder(encoding: str) -> Encoder:
    """The body encoder of `encoding` ("json" or "columns"); its head comes from encode_head(head, encoding)."""
    return encode if encoding == "json" else encode_columns


def _checked(records: Sequence[Record], offset: float) -> Iterator[tuple]:
    """Each record as (step, wall-clock end, duration, wait, samples, comm wait or None), its times checked
    finite: the one reading of a record both encoders share."""
    for record in records:
        if len(record) == 5:
            step, end, duration, wait, samples = record
            comm = None
        else:
            step, end, duration, wait, samples, comm = record
        end += offset
        if not (isfinite(end) and isfinite(duration) and isfinite(wait)):
            raise ValueError(f"step {step} has a non-finite time")
        yield step, end, duration, wait, samples, comm


def encode(head: str, records: Sequence[Record], wall_now: float, mono_now: float, *, final: bool = False) -> bytes:
    """The JSON body for `records`; step ends are mapped from the monotonic clock to unix time now.

    No records is a heartbeat (the process lives and has nothing to report); `final` marks the rank's
    last push (its process is ending)."""
    # Mapping at push time rather than per step keeps time.time() off the hot path, and an NTP
    # step between pushes shifts only the pushes after it.
    parts = []
    for step, end, duration, wait, samples, comm in _checked(records, wall_now - mono_now):
        count = "null" if samples is None else "%d" % samples
        if comm is None:
            parts.append(_STEP % (step, end, duration, wait, count))
        else:
            parts.append(_STEP_COMM % (step, end, duration, wait, count, _fit_comm_wait(comm, duration, wait)))
    return (head + ",".join(parts) + ("],\"final\":true}" if final else "]}")).encode()


def encode_columns(head: str, records: Sequence[Record], wall_now: float, mono_now: float, *,
                   final: bool = False) -> bytes:
    """The columnar body for `records` (same rules as `encode`; full float64 precision, no rounding)."""
    steps, samples = array("q"), array("q")
    ends, durations, waits, comms = array("d"), array("d"), array("d"), array("d")
    measured = counted = False
    for step, end, duration, wait, count, comm in _checked(records, wall_now - mono_now):
        steps.append(step)
        ends.append(end)
        durations.append(duration)
        waits.append(wait)
        samples.append(-1 if count is None else count)
        counted = counted or count is not None
        if comm is None:
            comms.append(nan)  # NaN: not measured
        else:
            comms.append(_fit_comm_wait(comm, duration, wait))
            measured = True
    fields = {"step": steps, "samples": samples if counted else None, "end": ends, "duration_s": durations,
              "data_wait_s": waits, "comm_wait_s": comms if measured else None}
    columns = ",".join(f'"{name}":"{_base64(fields[name])}"' for name, _ in COLUMN_FIELDS if fields[name] is not None)
    return (head + "{" + columns + ("},\"final\":true}" if final else "}}")).encode()


def _base64(values: array) -> str:
    if sys.byteorder != "little":  # the contract's byte order
        values = array(values.typecode, values)
        values.byteswap()
    return base64.b64encode(values.tobytes()).decode("ascii")


def _fit_comm_wait(comm: float, duration: float, wait: float) -> float:
    """Comm wait cut to what the step leaves after its data wait, so the service never refuses the push.

    It can exceed that by clock rounding, or when it was measured between steps (it then counts toward
    the next step, which a fetch opens only later). Never negative; NaN becomes 0.
    """
    room = duration - wait - _ROUNDING_S
    comm = min(comm, room)  # min(nan, x) is nan: caught below
    return comm if comm > 0.0 else 0.0
