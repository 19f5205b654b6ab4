"""A judged push written back as a columnar push body: how the node relay turns what a rank sent (either
encoding) into one line of a batch (gpumond/wire/batch.py), with what it filled in."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping

import numpy as np

from gpumond.push.values import StepColumns

_LE_I8 = np.dtype("<i8")
_LE_F8 = np.dtype("<f8")
_ROWS = {"end": 0, "duration_s": 1, "data_wait_s": 2, "comm_wait_s": 3}


def columns_body(head: Mapping[str, object], steps: StepColumns) -> bytes:
    """The columnar push of `head` (job, rank, world_size, node, gpu_uuid, group, incarnation, final: None values
    left out) and `steps`, every value exactly as decoded (float64 in, float64 out). Optional columns are left out
    when no step has them, as the SDK leaves them out."""
    arrays: dict[str, str] = {"step": _b64(steps.step, _LE_I8)}
    if steps.samples is not None and bool((steps.samples >= 0).any()):
        arrays["samples"] = _b64(steps.samples, _LE_I8)
    for name, row in _ROWS.items():
        values = steps.values[row]
        if name == "comm_wait_s" and not bool((~np.isnan(values)).any()):
            continue  # not measured by any step
        arrays[name] = _b64(values, _LE_F8)
    body = {k: v for k, v in head.items() if v is not None and v is not False}
    body["columns"] = arrays
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def _b64(values: np.ndarray, dtype: np.dtype) -> str:
    return base64.b64encode(np.ascontiguousarray(values, dtype=dtype).tobytes()).decode("ascii")
