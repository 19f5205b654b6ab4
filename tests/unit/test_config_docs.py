"""docs/configuration.md stays in step with AgentConfig."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import BaseModel

from gpumond.config import AgentConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


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
