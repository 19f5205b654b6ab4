"""Every relative link and embedded image in the README, docs/ and the benchmark results resolves to a file or
directory of the repository, and so does a repository path cited in backticks (`benchmarks/…/x.md`). Links to
the web and anchors within a page are not checked."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "benchmarks" / "results").glob("*.md")])
# <img src=…> / <a href=…> written as HTML inside Markdown
# A repository path written as inline code: a citation of a file, which must exist like a link's target.
CITED_PATH = re.compile(r"(?:benchmarks|dashboards|deploy|docs|gpumond|scripts|tests)/[\w./-]+")
HTML_TARGET = re.compile(r"""<(?:img|a)\b[^>]*?\b(?:src|href)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)


def targets(text: str) -> Iterator[str]:
    """The href of every link and the src of every image, as CommonMark parses them (code spans and blocks
    are text, not links), then every repository path cited as inline code, relative to the repository."""
    for token in MarkdownIt("commonmark").enable("table").parse(text):
        if token.type == "html_block":
            yield from HTML_TARGET.findall(token.content)
        for child in token.children or ():
            if child.type == "link_open":
                yield str(child.attrs["href"])
            elif child.type == "image":
                yield str(child.attrs["src"])
            elif child.type == "html_inline":
                yield from HTML_TARGET.findall(child.content)
            elif child.type == "code_inline" and CITED_PATH.fullmatch(child.content):
                yield "/" + child.content  # from the repository's root


def broken(page: Path, root: Path = REPO) -> list[str]:
    out = []
    for target in targets(page.read_text(encoding="utf-8")):
        parts = urllib.parse.urlsplit(target)
        if parts.scheme or parts.netloc or not parts.path:  # the web, mailto:, or an anchor on this page
            continue
        path = urllib.parse.unquote(parts.path)
        resolved = (root / path[1:] if path.startswith("/") else page.parent / path).resolve()
        if not resolved.is_relative_to(root) or not resolved.exists():
            out.append(target)
    return out


def test_the_pages_are_found() -> None:
    names = {p.relative_to(REPO).as_posix() for p in PAGES}
    assert {"README.md", "docs/configuration.md", "docs/runbooks/README.md", "benchmarks/results/detection.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_and_images_resolve(page: Path) -> None:
    assert broken(page) == [], f"{page.relative_to(REPO)}: links to files that do not exist"


def test_the_check_sees_links_images_and_html_but_not_code(tmp_path: Path) -> None:
    (tmp_path / "here.md").write_text("x")
    page = tmp_path / "page.md"
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "cited.md").write_text("x")
    page.write_text("[ok](here.md#part) [gone](gone.md) ![img](missing.png) [web](https://example.com) [a](#top)\n"
                    '<img src="nope.png">\n\n`[code](not-a-link.md)` `docs/cited.md` `docs/uncited.md`\n\n'
                    "```\n[fenced](nor-this.md) docs/in-a-block.md\n```\n| table | [cell](cell.md) |\n|---|---|\n")
    assert broken(page, tmp_path) == ["gone.md", "missing.png", "nope.png", "/docs/uncited.md", "cell.md"]
