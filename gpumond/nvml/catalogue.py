"""The field catalogue: metric name, reader, unit conversion, type, help and tier, kept as data in fields.csv."""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

from gpumond.nvml.calls import READERS
from gpumond.types import Labels

# Clock-event reason bits (nvmlClocksEventReason*), named as they are exported.
CLOCK_EVENT_REASONS: Mapping[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


@dataclass(frozen=True, slots=True)
class Field:
    """One catalogue row: how a value read from NVML becomes an exported series."""

    metric: str
    type: str  # "gauge" | "counter"
    reader: str
    key: str
    scale: float | None  # None: a bitmask expanded into one series per reason
    labels: Labels
    tier: str
    help: str


def _parse_labels(text: str) -> Labels:
    if not text:
        return ()
    return tuple(tuple(pair.split("=", 1)) for pair in text.split(";"))  # type: ignore[misc]


def load_catalogue(text: str | None = None, name: str = "fields.csv") -> tuple[Field, ...]:
    """Parse fields.csv (or `text`, named `name` in errors), checking every row names a known reader and a sane
    type."""
    if text is None:
        text = _packaged("fields.csv")
    readers = {r.name: r for r in READERS}
    fields = []
    for n, row in enumerate(csv.DictReader(text.splitlines()), start=2):
        if row["reader"] not in readers:
            raise ValueError(f"{name} line {n}: unknown reader {row['reader']!r}")
        if row["type"] not in ("gauge", "counter"):
            raise ValueError(f"{name} line {n}: type must be gauge or counter, not {row['type']!r}")
        if row["tier"] != readers[row["reader"]].tier:
            raise ValueError(f"{name} line {n}: tier {row['tier']!r} differs from reader {row['reader']!r}")
        scale = None if row["scale"] == "bitmask" else float(row["scale"])
        fields.append(Field(row["metric"], row["type"], row["reader"], row["key"], scale,
                            _parse_labels(row["labels"]), row["tier"], row["help"]))
    return tuple(fields)


def _packaged(name: str) -> str:
    return resources.files("gpumond.nvml").joinpath(name).read_text(encoding="utf-8")


CATALOGUE: tuple[Field, ...] = load_catalogue()
# Each NVLink's counters (throughput, errors), exported only with `exposition.nvlink_per_link`: under their
# own metric names, so that a sum() over the per-GPU totals of CATALOGUE never counts a link twice.
LINK_CATALOGUE: tuple[Field, ...] = load_catalogue(_packaged("nvlink_links.csv"), "nvlink_links.csv")
