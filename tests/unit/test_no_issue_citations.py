"""The product, its docs, benchmarks, deployment files and tests cite no issue of the project's tracker ("issue
25", "issue #12", "(#30)"): a user has only the repository, so each place says the reason the issue stood for
(what was measured, what defect a test guards, what a decision records). CHANGELOG.md, outside these trees, may.
Another project's issue is cited with that project's name ("dcgm-exporter #340"), which this does not flag."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TREES = ("gpumond", "docs", "deploy", "benchmarks", "dashboards", "scripts", "tests", "README.md")
# "issue 25", "Issue #12", "issue-25", "issues 12", and a bare "(#30)" or "(#30, #31)"; not an anchor "(#3-scaling-out)"
CITATION = re.compile(r"\bissues?[ -]?#?\d+|\(#\d+[,)]", re.IGNORECASE)
BINARY_SUFFIXES = frozenset({".png", ".pyc", ".gz", ".tgz", ".whl"})


def files(root: Path, trees: Iterable[str] = TREES) -> list[Path]:
    """Every text file under the trees (a tree may be a single file), without caches and this test."""
    out = []
    for name in trees:
        top = root / name
        for path in [top] if top.is_file() else sorted(top.rglob("*")):
            if (path.is_file() and path.suffix not in BINARY_SUFFIXES and "__pycache__" not in path.parts
                    and path.resolve() != Path(__file__).resolve()):
                out.append(path)
    return out


def citations(root: Path, trees: Iterable[str] = TREES) -> list[str]:
    """`file:line: text` for every line of the trees that cites an issue number."""
    found = []
    for path in files(root, trees):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # a binary file without a known suffix: no prose to read
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if CITATION.search(line):
                found.append(f"{path.relative_to(root).as_posix()}:{number}: {line.strip()[:120]}")
    return found


def test_the_scan_reads_the_product_docs_benchmarks_and_tests() -> None:
    names = {p.relative_to(REPO).as_posix() for p in files(REPO)}
    assert {"README.md", "docs/detectors.md", "benchmarks/RESULTS.md", "gpumond/rules/detectors/config.py",
            "tests/unit/test_detectors.py", "deploy/helm/gpumond/values.yaml"} <= names
    assert "tests/unit/test_no_issue_citations.py" not in names
    assert "CHANGELOG.md" not in names


def test_nothing_cites_an_issue_number() -> None:
    found = citations(REPO)
    assert found == [], "cite the reason, not the tracker's issue number:\n" + "\n".join(found)


def test_the_scan_names_each_citation_by_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "Fine: dcgm-exporter #340, rank #3, `ca.issue(\"tls\")`, [up](#3-scaling-out), open an issue against it.\n"
        "Measured for issue 25.\nSee (#30) and (#31, #32).\nAs Issue #12 said, issue-7, issues 4 and 5.\n")
    (tmp_path / "README.md").write_text("nothing here\n")
    (tmp_path / "docs" / "image.png").write_bytes(b"\x89PNG issue 1")
    (tmp_path / "docs" / "blob").write_bytes(b"\xff\xfe issue 2")
    assert [f.split(": ")[0] for f in citations(tmp_path, ("docs", "README.md", "absent"))] == [
        "docs/page.md:2", "docs/page.md:3", "docs/page.md:4"]
