"""JSON Schemas generated from the config models, and the Helm chart's values schema that embeds them.

The chart passes `agent.config` and `rules.config` through to the daemons as agent.yaml and rules.yaml. Its
values schema embeds the schemas of those two models, so `helm install` / `helm template` refuse an unknown
key or a wrong type inside them (a typo like `sampling.fast_intervall_s`) instead of rendering a pod that
crash-loops. What a JSON Schema cannot say (an absolute path, an environment variable name, one bound against
another) the daemon still checks at start and `gpumond check-config` checks on the rendered file.

    python -m gpumond.config.json_schema deploy/helm/gpumond/values.schema.json   # rewrite the embedded parts

The rest of the values schema is written by hand; only `definitions` and the two `config` entries are
replaced, and a test fails when the committed file differs from what this writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from gpumond.config.agent import AgentConfig
from gpumond.config.rules import RulesConfig

# values key → (model, what the embedded schema says about it)
EMBEDDED: dict[str, tuple[type[BaseModel], str]] = {
    "agent": (AgentConfig, "agent.yaml (docs/configuration.md), generated from the agent's config model"),
    "rules": (RulesConfig, "rules.yaml (docs/configuration.md), generated from the rules service's config model"),
}
_PYDANTIC_DEFS = "#/$defs/"


def config_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema of what a config file for `model` may contain (pydantic's, validation side)."""
    return model.model_json_schema(mode="validation")


def embed_in_values_schema(values_schema: dict[str, Any]) -> dict[str, Any]:
    """`values_schema` with `<component>.config` replaced by the generated schemas (a new dict).

    Each model's sub-schemas move to the top-level `definitions` under `<component>.<Name>` (agent and rules
    both have, e.g., a LogConfig), and their references are rewritten to point there: the values schema is
    draft-07, which resolves `#/definitions/...` in every validator Helm and the tests use.
    """
    out = json.loads(json.dumps(values_schema))  # a deep copy that also proves it is plain JSON
    definitions: dict[str, Any] = {}
    for component, (model, description) in EMBEDDED.items():
        schema = config_schema(model)
        prefix = f"#/definitions/{component}."
        for name, sub in schema.pop("$defs", {}).items():
            definitions[f"{component}.{name}"] = _rewrite_refs(sub, prefix)
        schema = _rewrite_refs(schema, prefix)
        schema.pop("title", None)
        schema["description"] = description
        out["properties"][component]["properties"]["config"] = schema
    out["definitions"] = dict(sorted(definitions.items()))
    return out


def _rewrite_refs(node: Any, prefix: str) -> Any:
    if isinstance(node, dict):
        return {k: (prefix + v.removeprefix(_PYDANTIC_DEFS) if k == "$ref" and isinstance(v, str)
                    and v.startswith(_PYDANTIC_DEFS) else _rewrite_refs(v, prefix)) for k, v in node.items()}
    if isinstance(node, list):
        return [_rewrite_refs(v, prefix) for v in node]
    return node


def render(values_schema: dict[str, Any]) -> str:
    """The values schema file's text, as committed (two-space indent, trailing newline)."""
    return json.dumps(embed_in_values_schema(values_schema), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    """Rewrite the values schema file named in argv in place."""
    if len(argv) != 1:
        print("usage: python -m gpumond.config.json_schema deploy/helm/gpumond/values.schema.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    path.write_text(render(json.loads(path.read_text(encoding="utf-8"))), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
