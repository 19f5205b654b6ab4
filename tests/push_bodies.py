"""A push body in either encoding from one JSON-shaped dict, so the ingest tests run on both.

`encode(body, "columns")` turns `steps` (a list of step objects) into the columnar encoding's `columns`
(base64 little-endian int64 / float64 arrays); a body whose steps cannot be said in columns (a step that is
not an object, a value that is not a number, a missing key) gives None: that case exists only in JSON.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from typing import Any

from gpumond.wire.media import CONTENT_TYPES, ENCODINGS  # noqa: F401 (the tests' encodings are the contract's)
FLOATS = ("end", "duration_s", "data_wait_s", "comm_wait_s")


def pack(fmt: str, values: list) -> str:
    """`values` as base64 of little-endian 8-byte values (`fmt` q: int64, d: float64)."""
    return base64.b64encode(struct.pack(f"<{len(values)}{fmt}", *values)).decode()


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def columns_of(steps: Any) -> dict[str, str] | None:
    """The `columns` object for a list of step objects, or None when JSON alone can say these steps."""
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        return None
    for s in steps:
        if not all(k in s for k in ("step", "end", "duration_s", "data_wait_s")):
            return None
        if not isinstance(s["step"], int) or isinstance(s["step"], bool) or not -2**63 <= s["step"] < 2**63:
            return None
        if not all(_number(s[k]) for k in FLOATS[:3]):
            return None
        if s.get("comm_wait_s") is not None and not _number(s["comm_wait_s"]):
            return None
        samples = s.get("samples")
        if samples is not None and (not isinstance(samples, int) or isinstance(samples, bool) or samples < 0):
            return None
    out = {"step": pack("q", [s["step"] for s in steps])}
    for k in FLOATS[:3]:
        out[k] = pack("d", [float(s[k]) for s in steps])
    if any(s.get("comm_wait_s") is not None for s in steps):
        out["comm_wait_s"] = pack("d", [math.nan if s.get("comm_wait_s") is None else float(s["comm_wait_s"])
                                        for s in steps])
    if any(s.get("samples") is not None for s in steps):
        out["samples"] = pack("q", [-1 if s.get("samples") is None else s["samples"] for s in steps])
    return out


def encode(body: Any, encoding: str) -> bytes | None:
    """The body's bytes in `encoding` (None: it cannot be said in the columnar encoding)."""
    if encoding == "json":
        return json.dumps(body).encode()
    if not isinstance(body, dict) or "steps" not in body:
        return None
    columns = columns_of(body["steps"])
    if columns is None:
        return None
    out = {k: v for k, v in body.items() if k != "steps"}
    out["columns"] = columns
    return json.dumps(out).encode()


def steps_of(body: bytes) -> list[dict]:
    """The step objects a body of either encoding carries (a columnar body read back into objects; NaN comm wait
    and -1 samples as absent)."""
    data = json.loads(body)
    if "steps" in data:
        return data["steps"]
    cols = data["columns"]
    read = {k: struct.unpack(f"<{len(base64.b64decode(v)) // 8}{'q' if k in ('step', 'samples') else 'd'}",
                             base64.b64decode(v)) for k, v in cols.items()}
    out = []
    for i in range(len(read["step"])):
        s = {k: read[k][i] for k in ("step", "end", "duration_s", "data_wait_s")}
        s["samples"] = None if "samples" not in read or read["samples"][i] == -1 else read["samples"][i]
        if "comm_wait_s" in read and not math.isnan(read["comm_wait_s"][i]):
            s["comm_wait_s"] = read["comm_wait_s"][i]
        out.append(s)
    return out
