"""What a reader is: NVML calls that return a group of catalogue values, preferred first; and how one
field value is decoded. A leaf the reader modules (`calls`, `gpm`, `nvlink`) share.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pynvml

Values = Mapping[str, float]


@dataclass(frozen=True, slots=True)
class Call:
    """One way to read a reader's values; `symbol` names the NVML function for logs and metrics."""

    symbol: str
    fn: Callable[[Any], Values]


@dataclass(frozen=True, slots=True)
class Reader:
    """A group of catalogue values that one NVML call (or a fixed few) returns.

    `release(handle)`, where given, frees what the reader holds for a GPU (GPM's sample buffers); the
    session calls it when that handle goes out of use (GPU lost, re-initialised, NVML closed).
    """

    name: str
    tier: str  # "fast" | "slow"
    calls: tuple[Call, ...]
    release: Callable[[Any], None] | None = None


def field_value(entry: Any) -> float:
    """Decode one c_nvmlFieldValue_t by its declared value type."""
    kind = entry.valueType
    v = entry.value
    if kind == pynvml.NVML_VALUE_TYPE_DOUBLE:
        return float(v.dVal)
    if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return float(v.uiVal)
    if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return float(v.ulVal)
    if kind == pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return float(v.sllVal)
    if kind == pynvml.NVML_VALUE_TYPE_SIGNED_INT:
        return float(v.siVal)
    if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT:
        return float(v.usVal)
    return float(v.ullVal)
