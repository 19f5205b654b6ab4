"""docs/runbooks/ stays in step with the alert catalogue and the Prometheus rules.

Every alert of gpumond/alerts/catalogue.py has a page docs/runbooks/<alertname>.md with the
sections Meaning, Confirm (with a command), Do and Escalate, and a header that states its
catalogue severity and who raises it; every page is an alert; the index links every page; every
runbook_url in deploy/prometheus points to an existing page; runbook_url() builds the page URL.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gpumond.agent.policy.xid_table import XID_TABLE
from gpumond.alerts.catalogue import ALERTS, DEFAULT_RUNBOOK_BASE, runbook_url

ROOT = Path(__file__).resolve().parents[2]
RUNBOOKS = ROOT / "docs" / "runbooks"
SECTIONS = ["Meaning", "Confirm", "Do", "Escalate"]
RAISED_BY = {"agent": "the agent", "rules": "the rules service", "prometheus": "Prometheus only"}
PAGE_URL = re.compile(re.escape(DEFAULT_RUNBOOK_BASE) + r"/([A-Za-z0-9]+)\.md")


def _pages() -> dict[str, Path]:
    return {p.stem: p for p in RUNBOOKS.glob("*.md") if p.name != "README.md"}


def _sections(text: str) -> dict[str, str]:
    """'## Title' → the text up to the next '## ' heading, in document order."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2], strict=True)}


def test_every_alert_has_a_page_and_every_page_is_an_alert() -> None:
    pages = _pages()
    assert sorted(set(ALERTS) - set(pages)) == [], "catalogue alerts without a runbook page"
    assert sorted(set(pages) - set(ALERTS)) == [], "runbook pages for alerts the catalogue does not have"


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_page_has_its_title_header_and_sections(name: str) -> None:
    text = (RUNBOOKS / f"{name}.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert lines[0] == f"# {name}", f"{name}.md must start with '# {name}'"
    header = next((line for line in lines[1:6] if line.startswith("**Severity:**")), None)
    assert header is not None, f"{name}.md: no '**Severity:** …' line under the title"
    spec = ALERTS[name]
    severity = header.split("·")[0]
    if spec.severity is not None:
        assert f"**Severity:** {spec.severity} " in severity + " ", f"{name}.md: {header!r} vs {spec.severity}"
    else:  # per event: every severity the XID table uses is named
        assert all(s in severity for s in {i.severity for i in XID_TABLE.values()}), header
    assert RAISED_BY[spec.source] in header or (name == "Watchdog" and "Prometheus" in header), header

    sections = _sections(text)
    assert list(sections) == SECTIONS, f"{name}.md: sections {list(sections)}, expected {SECTIONS}"
    for title, body in sections.items():
        assert len(body.strip()) > 40, f"{name}.md: section {title!r} is (nearly) empty"
    assert re.search(r"^```(sh|promql)\n.+?^```", sections["Confirm"], flags=re.MULTILINE | re.DOTALL), \
        f"{name}.md: Confirm needs a command in a ```sh or ```promql block"


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_page_links_resolve(name: str) -> None:
    text = (RUNBOOKS / f"{name}.md").read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if target.startswith(("http://", "https://")):
            continue
        assert (RUNBOOKS / target).resolve().exists(), f"{name}.md links to missing {target}"


def test_the_index_links_every_page_and_the_old_page_points_to_it() -> None:
    index = (RUNBOOKS / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([A-Za-z0-9]+)\.md\)", index))
    assert linked == set(ALERTS), f"index links {sorted(linked ^ set(ALERTS))} wrongly"
    old = (ROOT / "docs" / "runbooks.md").read_text(encoding="utf-8")
    assert "(runbooks/README.md)" in old and len(old.splitlines()) < 15, "docs/runbooks.md should only point"


def test_runbook_url_names_the_page() -> None:
    for name in ALERTS:
        assert runbook_url(name).endswith(f"docs/runbooks/{name}.md"), runbook_url(name)
        assert runbook_url(name, base="https://wiki.example/runbooks/") == f"https://wiki.example/runbooks/{name}.md"


def test_every_runbook_url_in_the_prometheus_rules_points_to_an_existing_page() -> None:
    files = sorted((ROOT / "deploy" / "prometheus").glob("*.yml"))
    assert files, "no rule files under deploy/prometheus"
    seen = 0
    for path in files:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                url = rule.get("annotations", {}).get("runbook_url")
                if "alert" not in rule:
                    continue
                assert url == runbook_url(rule["alert"]), f"{path.name}: {rule['alert']} runbook_url {url}"
                m = PAGE_URL.fullmatch(url)
                assert m and (RUNBOOKS / f"{m.group(1)}.md").is_file(), f"{url} has no page"
                seen += 1
    assert seen >= len(ALERTS)


def test_every_runbook_url_in_the_deploy_and_docs_tree_points_to_a_page() -> None:
    """Any runbook link anywhere in deploy/ (e.g. the Alertmanager templates) names an existing page."""
    for path in [*(ROOT / "deploy").rglob("*.yml"), *(ROOT / "deploy").rglob("*.tmpl"), *(ROOT / "docs").rglob("*.md")]:
        for page in PAGE_URL.findall(path.read_text(encoding="utf-8")):
            assert page == "README" or page in ALERTS, f"{path.relative_to(ROOT)} links to runbook {page}.md"
            assert (RUNBOOKS / f"{page}.md").is_file(), f"{path.relative_to(ROOT)}: no page {page}.md"
