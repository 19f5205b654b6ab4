"""`gpumond check-config` without --kind: told from the keys only one kind takes, else the file name, else asked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpumond.config import ConfigError
from gpumond.config.kind import AGENT_ONLY, RULES_ONLY, SHARED, guess_kind

REPO = Path(__file__).resolve().parents[2]
# What the chart renders into the rules ConfigMap by default: only keys an agent config takes too.
CHART_RULES = "listen: 0.0.0.0:9481\nstate_dir: /var/lib/gpumond-rules\n"


def check(path: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumond.cli", "check-config", *extra, str(path)],
                          capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", **(env or {})})


def test_the_key_sets_come_from_both_models() -> None:
    assert {"shard", "tokens", "telemetry", "limits"} <= RULES_ONLY
    assert {"policy", "sampling", "node_name"} <= AGENT_ONLY
    assert SHARED == {"listen", "state_dir", "alerting", "log", "http", "web_config_file"}


@pytest.mark.parametrize(("name", "keys", "expected"), [
    ("config.yaml", ["listen", "shard"], ("rules", "its keys")),
    ("rules.yaml", ["policy"], ("agent", "its keys")),  # keys beat the name
    ("rules.yaml", ["listen", "state_dir"], ("rules", "its file name")),
    ("gpumond-agent.yaml", ["listen"], ("agent", "its file name")),
    ("agent.yaml", [], ("agent", "its file name")),
])
def test_guess(name: str, keys: list[str], expected: tuple[str, str]) -> None:
    assert guess_kind(Path(name), keys) == expected


@pytest.mark.parametrize(("name", "keys", "message"), [
    ("config.yaml", ["listen", "state_dir"],
     "config.yaml: cannot tell an agent config from a rules config: it sets only keys both take (listen, "
     "state_dir); pass --kind agent or --kind rules"),
    ("agent-and-rules.yaml", [], "sets only keys both take (no keys); pass --kind agent or --kind rules"),
    ("x.yaml", ["policy", "tokens"], "x.yaml: has agent keys (policy) and rules keys (tokens)"),
    # a typo in the only key that would have told is named, with the key it was meant to be
    ("x.yaml", ["listn"], "x.yaml: unknown key 'listn' (did you mean 'listen'?): neither an agent nor a rules"),
    ("x.yaml", ["log", "polcy", "zzz"], "unknown keys 'polcy' (did you mean 'policy'?), 'zzz':"),
])
def test_files_that_do_not_tell_are_refused_saying_what_to_pass(name: str, keys: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        guess_kind(Path(name), keys)
    assert message in str(e.value)


def test_the_charts_minimal_rules_config_is_checked_as_rules(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(CHART_RULES)
    p = check(rules, env={"GPUMOND_RULES_TOKENS": "0123456789abcdef0123"})  # the chart's Secret gives tokens
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"{rules}: ok (rules config, told by its file name; listen 0.0.0.0:9481, 1 token(s)")
    p = check(rules)  # without tokens a rules service would not start: said, with how the kind was told
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "no push tokens configured" in p.stderr and "checked as a rules config, told by its file name" in p.stderr


def test_an_unnamed_minimal_config_asks_for_kind_and_kind_decides(tmp_path: Path) -> None:
    f = tmp_path / "config.yaml"
    f.write_text(CHART_RULES)
    p = check(f)
    assert p.returncode == 2 and p.stdout == "" and p.stderr.count("\n") == 1
    assert "pass --kind agent or --kind rules" in p.stderr
    p = check(f, "--kind", "rules", env={"GPUMOND_RULES_TOKENS": "0123456789abcdef0123"})
    assert p.returncode == 0 and p.stdout.startswith(f"{f}: ok (rules config; listen"), p.stderr


@pytest.mark.parametrize(("given", "text", "expected"), [
    ("agent", "tokens: [abcdefghijklmnopqrstuvwxyz0123]\ntelemetry: {scrape: {targets: []}}\nwindow_s: 300\n",
     "looks like a rules config (telemetry, tokens, window_s), not an agent config: check it with --kind rules"),
    ("rules", "sampling: {interval_s: 5}\npolicy: {mode: dry_run}\n",
     "looks like an agent config (policy, sampling), not a rules config: check it with --kind agent"),
])
def test_the_wrong_kind_given_is_named_instead_of_its_unknown_keys(tmp_path: Path, capsys, given: str, text: str,
                                                                   expected: str) -> None:
    from gpumond.cli import main

    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert main(["check-config", "--kind", given, str(path)]) == 2
    assert capsys.readouterr().err == f"gpumond: {path}: {expected}\n"


def test_a_daemon_given_the_other_kind_of_config_says_which_daemon_takes_it(tmp_path: Path, capsys) -> None:
    from gpumond.cli import main

    path = tmp_path / "gpumond.yaml"
    path.write_text("tokens: [abcdefghijklmnopqrstuvwxyz0123]\nshard: 0/2\n")
    assert main(["agent", "--sim", "1", "--config", str(path)]) == 2
    assert capsys.readouterr().err == (f"gpumond: {path}: looks like a rules config (shard, tokens), not an agent "
                                       "config: give it to `gpumond rules`\n")


def test_a_real_mistake_in_a_config_of_the_kind_given_is_still_named(tmp_path: Path, capsys) -> None:
    from gpumond.cli import main

    path = tmp_path / "agent.yaml"
    path.write_text("sampling: {interval_s: 5}\ntokens: [x]\n")  # one agent key: an agent config with a stray key
    assert main(["check-config", "--kind", "agent", str(path)]) == 2
    assert "sampling.interval_s: unknown key" in capsys.readouterr().err
