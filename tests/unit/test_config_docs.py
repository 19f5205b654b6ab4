"""The config docs stay in step with the config models: docs/configuration.md with AgentConfig, the rules.yaml
table of docs/rules-api.md with RulesConfig. Every key is documented and every documented key exists."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import BaseModel

from gpumond.config import AgentConfig
from gpumond.config.rules import RulesConfig

DOCS = Path(__file__).resolve().parents[2] / "docs"
DOC = DOCS / "configuration.md"
RULES_DOC = DOCS / "rules-api.md"


def leaf_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for name, field in model.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            keys |= leaf_keys(sub, f"{prefix}{name}.")
        else:
            keys.add(prefix + name)
    return keys


def test_every_key_is_documented_and_nothing_more() -> None:
    documented = set(re.findall(r"^\| `([a-z_.]+)` \|", DOC.read_text(), flags=re.MULTILINE))
    assert documented == leaf_keys(AgentConfig)


def test_example_block_in_the_docs_validates_to_the_defaults() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    example = next(b for b in blocks if b.startswith("listen:"))
    assert AgentConfig.model_validate(yaml.safe_load(example)) == AgentConfig.default()


def rules_table(text: str) -> str:
    """The key table under the rules.yaml heading of rules-api.md (up to the next heading)."""
    section = text.split("## Configuration (`rules.yaml`)", 1)[1].split("\n#", 1)[0]
    return "\n".join(line for line in section.splitlines() if line.startswith("| `"))


def section_keys(model: type[BaseModel], section: str) -> set[str]:
    return {k for k in leaf_keys(model) if k.startswith(section + ".")}


def documented_rules_keys(table: str, model: type[BaseModel]) -> set[str]:
    """The keys a row's first cell names. A cell may name several (`log.level`, `log.format`), continue the
    previous one with a leading dot (`remediation.slurm.scontrol`, `.sinfo`), or stand for a whole section shared
    with the agent (`http.*`, whose keys docs/configuration.md lists and the agent's test checks)."""
    keys: set[str] = set()
    for row in table.splitlines():
        parent = ""
        for name in re.findall(r"`([a-z_.*]+)`", row.split("|")[1]):
            if name.endswith(".*"):
                keys |= section_keys(model, name[:-2]) or {name}
                continue
            if name.startswith("."):
                name = parent + name
            parent = name.rsplit(".", 1)[0] if "." in name else ""
            keys.add(name)
    return keys


def test_every_rules_key_is_documented_and_nothing_more() -> None:
    documented = documented_rules_keys(rules_table(RULES_DOC.read_text()), RulesConfig)
    expected = leaf_keys(RulesConfig)
    assert sorted(expected - documented) == [], "rules config keys missing from docs/rules-api.md"
    assert sorted(documented - expected) == [], "docs/rules-api.md documents keys the rules config lacks"


def test_sections_the_rules_doc_calls_the_agents_are_the_agents() -> None:
    shared = re.findall(r"^\| `([a-z_]+)\.\*` \|", rules_table(RULES_DOC.read_text()), flags=re.MULTILINE)
    assert shared, "the rules table names no shared section: update this test"
    for section in shared:
        assert section_keys(RulesConfig, section) == section_keys(AgentConfig, section), section
