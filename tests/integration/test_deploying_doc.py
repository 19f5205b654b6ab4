"""docs/deploying.md runs: its `helm install|upgrade` commands render valid objects, its configs pass check-config.

The commands are parsed as Helm parses them (`-f` files in order, then `--set`, with Helm's own --set parser),
rendered by the Helm engine, validated like the chart's ci/ values, and the configs they render checked by
`gpumond check-config`. YAML blocks that start with `# /etc/gpumond/agent.yaml` or `# /etc/gpumond/rules.yaml`
are checked too, with the secret files they name created as stand-ins.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python
import pytest

from tests.integration.helm_helpers import CHART, EXISTING_SECRET, check_config, render, validation_problems
from tests.integration.helpers import REPO_ROOT

pytestmark = pytest.mark.integration

DOC = REPO_ROOT / "docs" / "deploying.md"
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def _commands() -> list[str]:
    lines = []
    for lang, body in BLOCKS:
        if lang == "sh":
            lines += [line.strip() for line in body.replace("\\\n", " ").splitlines()
                      if line.strip().startswith(("helm install", "helm upgrade"))]
    return lines


HELM_COMMANDS = _commands()
CONFIGS = [(m.group(1), body) for lang, body in BLOCKS if lang == "yaml"
           for m in [re.match(r"# /etc/gpumond/(agent|rules)\.yaml\b", body)] if m]


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of user values: maps merge key by key, anything else is replaced."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _parse_helm(command: str) -> tuple[str, str, dict[str, Any]]:
    """(release, namespace, values) of a `helm install|upgrade [--install] NAME CHART [flags]` line."""
    words = shlex.split(command)
    positional: list[str] = []
    namespace, values = "default", {}
    i = 2
    while i < len(words):
        word = words[i]
        if word in ("--namespace", "-n"):
            namespace, i = words[i + 1], i + 2
        elif word in ("-f", "--values"):
            values, i = _merge(values, helm_python.values_from_yaml((REPO_ROOT / words[i + 1]).read_text())), i + 2
        elif word == "--set":
            values, i = _merge(values, helm_python.parse_set_string(words[i + 1])), i + 2
        elif word in ("--create-namespace", "--install", "--reuse-values"):
            i += 1
        elif word.startswith("-"):
            raise AssertionError(f"{command}: flag {word} is not understood by this test; teach it")
        else:
            positional.append(word)
            i += 1
    release, chart = positional
    assert (REPO_ROOT / chart).resolve() == CHART.resolve(), command
    return release, namespace, values


def test_the_doc_has_examples_to_run() -> None:
    assert len(HELM_COMMANDS) >= 8 and len(CONFIGS) >= 3, (HELM_COMMANDS, CONFIGS)


def test_every_values_file_it_names_exists() -> None:
    for name in set(re.findall(r"ci/[\w-]+-values\.yaml", DOC.read_text())):
        assert (CHART / name).is_file(), name


@pytest.mark.parametrize("command", HELM_COMMANDS)
def test_helm_command_renders_valid_objects_and_configs(command: str, tmp_path: Path) -> None:
    release, namespace, values = _parse_helm(command)
    objects = tuple(render(values, release=release, namespace=namespace))
    assert [p for obj in objects for p in validation_problems(obj)] == []
    existing = EXISTING_SECRET if values.get("secret", {}).get("existingSecret") else None
    for component in ("agent", "rules"):
        result = check_config(objects, component, tmp_path, existing)
        assert result.returncode == 0, f"{component}: {result.stderr}"


# Stand-ins for the secret files the doc's configs name, so check-config reads them as the daemon would.
SECRET_FILES = {"rules-tokens": "0123456789abcdef0123456789abcdef\n",
                "slack-webhook": "https://hooks.slack.com/services/T000/B000/XXXX\n",
                "pagerduty-key": "0123456789abcdef0123456789abcdef\n",
                "agents.json": '[{"targets": ["gpu-node-01:9480"]}]\n'}


@pytest.mark.parametrize(("kind", "body"), CONFIGS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CONFIGS)])
def test_config_in_the_doc_passes_check_config(kind: str, body: str, tmp_path: Path) -> None:
    etc = tmp_path / "etc" / "gpumond"
    etc.mkdir(parents=True)
    for name, text in SECRET_FILES.items():
        (etc / name).write_text(text)
    named = set(re.findall(r"/etc/gpumond/([\w.-]+)", body)) - {f"{kind}.yaml"}
    assert named <= set(SECRET_FILES), f"the config names files this test does not stand in for: {named}"
    path = tmp_path / f"{kind}.yaml"
    path.write_text(body.replace("/etc/gpumond/", f"{etc}/"))
    result = subprocess.run([sys.executable, "-m", "gpumond.cli", "check-config", "--kind", kind, str(path)],
                            capture_output=True, text=True, timeout=60, check=False,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 0, result.stderr
