"""The import graph of gpumond/ is layered as docs/architecture.md says: no import (lazy ones included) runs from a
lower layer up (tests/import_graph.py reads the graph; test_import_cycles.py holds the whole package free of cycles)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.import_graph import import_graph

ROOT = Path(__file__).resolve().parents[2]
# Bottom first; a module's layer is that of the longest prefix naming it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("gpumond.types", "gpumond.logs", "gpumond.textformat", "gpumond.wire", "gpumond.state"),
    ("gpumond.config",),
    ("gpumond.web", "gpumond.nvml", "gpumond.push"),
    ("gpumond.alerts",),
    ("gpumond.agent", "gpumond.rules", "gpumond.job"),
    ("gpumond.cli", "gpumond.demo"),
)


def layer(module: str) -> int | None:
    best = None
    for n, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > len(best[1])):
                best = (n, p)
    return None if best is None else best[0]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(ROOT, ["gpumond"])


def test_every_module_has_a_layer(graph: dict[str, set[str]]) -> None:
    assert [m for m in graph if m != "gpumond" and layer(m) is None] == []


def test_no_import_runs_from_a_lower_layer_up(graph: dict[str, set[str]]) -> None:
    up = [f"{m} -> {t}" for m, targets in graph.items() for t in targets
          if layer(m) is not None and layer(t) is not None and layer(t) > layer(m)]  # type: ignore[operator]
    assert sorted(up) == []
