"""docs/architecture.md is true of the code: every module is placed, the defaults it quotes are the defaults,
and no doc or source file sends a reader to a file outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from gpumond.config import AgentConfig
from gpumond.config.rules import RulesConfig

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def test_every_package_and_shared_module_is_placed() -> None:
    packages = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "gpumond").glob("*/__init__.py")}
    for package in sorted(packages):
        assert f"`{package}/`" in DOC, f"{package}/ is not in the packages table"
    for module in sorted((ROOT / "gpumond").glob("*.py")):
        if module.name != "__init__.py":
            assert f"`{module.name}`" in DOC, f"gpumond/{module.name} is not in the packages table"
    for folder in ("dashboards", "deploy", "benchmarks", "tests"):
        assert f"`{folder}/`" in DOC


def quoted(pattern: str) -> float:
    found = re.search(pattern, DOC, re.S)
    assert found, f"architecture.md no longer says {pattern!r}"
    return float(found.group(1))


def test_the_defaults_it_quotes_are_the_defaults() -> None:
    agent, rules = AgentConfig(), RulesConfig()
    assert quoted(r"\*\*Fast tier\*\* \(default (\d+) s\)") == agent.sampling.fast_interval_s
    assert quoted(r"\*\*Slow tier\*\* \(default (\d+) s\)") == agent.sampling.slow_interval_s
    assert quoted(r"`findings.min_duration_s` \(default (\d+) s\)") == rules.findings.min_duration_s
    assert quoted(r"`findings.resolve_after_s` \(default (\d+) s\)") == rules.findings.resolve_after_s
    assert quoted(r"`evaluation_interval_s` \(default (\d+) s\)") == rules.evaluation_interval_s


OUTSIDE = re.compile(r"\b(?:" + "|".join(("DESIGN", "REFERENCES", "STYLE")) + r")\.md\b|/work/|shared/[A-Z]")


@pytest.mark.parametrize("top", ["docs", "gpumond", "tests", "benchmarks", "dashboards", "deploy", "README.md"])
def test_nothing_cites_a_file_outside_the_repository(top: str) -> None:
    files = subprocess.run(["git", "ls-files", top], cwd=ROOT, capture_output=True, text=True, check=True)
    bad = []
    for name in files.stdout.split():
        path = ROOT / name
        if path == Path(__file__).resolve():
            continue  # this file spells the patterns out
        if path.suffix in (".py", ".md", ".yaml", ".yml", ".txt", ".sh", ".toml", ".json") and path.is_file():
            for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if OUTSIDE.search(line):
                    bad.append(f"{name}:{n}: {line.strip()[:100]}")
    assert bad == []
