"""The import graph of gpumond/ is layered as docs/architecture.md says: no import (lazy ones included) runs from a
lower layer up, and the HTTP server, the command line, the config and the state files sit in no import cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "gpumond"
# Bottom first; a module's layer is that of the longest prefix naming it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("gpumond.types", "gpumond.logs", "gpumond.textformat", "gpumond.wire", "gpumond.state"),
    ("gpumond.config",),
    ("gpumond.web", "gpumond.nvml"),
    ("gpumond.alerts",),
    ("gpumond.agent", "gpumond.rules", "gpumond.job"),
    ("gpumond.cli", "gpumond.demo"),
)
ACYCLIC = ("gpumond.web", "gpumond.cli", "gpumond.config", "gpumond.state")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module → the gpumond modules it imports anywhere in its text (a lazy import is an arrow too)."""

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets |= {known(a.name) for a in node.names if a.name.startswith("gpumond")}
            elif isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(max(node.level - 1, 0)):
                    base = base.rpartition(".")[0]
                source = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
                if source.startswith("gpumond"):
                    targets |= {known(f"{source}.{a.name}") if f"{source}.{a.name}" in modules else known(source)
                                for a in node.names}
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def layer(module: str) -> int | None:
    best = None
    for n, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > len(best[1])):
                best = (n, p)
    return None if best is None else best[0]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return imports(_modules())


def test_every_module_has_a_layer(graph: dict[str, set[str]]) -> None:
    assert [m for m in graph if m != "gpumond" and layer(m) is None] == []


def test_no_import_runs_from_a_lower_layer_up(graph: dict[str, set[str]]) -> None:
    up = [f"{m} -> {t}" for m, targets in graph.items() for t in targets
          if layer(m) is not None and layer(t) is not None and layer(t) > layer(m)]  # type: ignore[operator]
    assert sorted(up) == []


def test_the_server_cli_config_and_state_sit_in_no_cycle(graph: dict[str, set[str]]) -> None:
    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for t in graph.get(todo.pop(), ()):
                if t == goal:
                    return True
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return False

    cyclic = [f"{m} <-> {t}" for m in graph if m.startswith(ACYCLIC) for t in graph[m] if reaches(t, m)]
    assert sorted(cyclic) == []
