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


# c_nvmlFieldValue_t's value union: which member holds a value of each declared type (unsigned long long else).
_UNION_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


def field_value(entry: Any) -> float:
    """Decode one c_nvmlFieldValue_t by its declared value type."""
    return float(getattr(entry.value, _UNION_MEMBER.get(entry.valueType, "ullVal")))
