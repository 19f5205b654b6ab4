"""Shared vocabulary: the value types that cross package boundaries."""

from __future__ import annotations

from dataclasses import dataclass

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Series:
    """One exported value: a catalogued metric name, its labels, its value in base units."""

    name: str
    labels: Labels
    value: float
