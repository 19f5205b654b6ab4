import os
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

import gpumond
from gpumond.cli import build_parser, main
from gpumond.config import AgentConfig
from gpumond.config.rules import TOKENS_ENV, RulesConfig, load_rules_config
from gpumond.nvml.sim import load_scenario
from tests.ports import free_port


def run(*args):
    return subprocess.run([sys.executable, "-m", "gpumond.cli", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("args, fragment", [
    (["agent", "--sim", "0"], "--sim: must be from 1 to 1024, got 0"),
    (["agent", "--sim-speed", "fast"], "--sim-speed: must be a number, got 'fast'"),
    (["agent", "--listen", "nohost"], "--listen: must be HOST:PORT"),
    (["agent", "--sim", "1", "--relay-listen", "0.0.0.0:9482"], "--relay-listen: 0.0.0.0 listens on every network"),
    (["agent", "--bogus"], "gpumond agent: unrecognized arguments: --bogus (see: gpumond agent --help)"),
    (["remediation", "list", "--bogus"], "gpumond remediation list: unrecognized arguments: --bogus (see: gpumond "
                                         "remediation list --help)"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["agent", "--sim", "1", "--state-dir", ""], "--state-dir: must be a directory path"),  # not the default
    (["agent", "--sim", "1", "--node-name", " "], "--node-name: must not be empty"),
    (["rules", "--config", str(Path(gpumond.__file__).parent.parent / "deploy/examples/rules.yaml"), "--listen", ""],
     "--listen: "),
    (["agent", "--sim-speed", "10"], "--sim-speed: applies to simulated GPUs only; add --sim N"),  # not ignored
    (["demo", "--nodes", "2"], "--nodes: must be from 3 to 1024 (the planted faults sit on nodes 0, 1 and 2), got 2"),
])
def test_bad_flags_exit_2_with_one_line(args, fragment):
    p = run(*args)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert fragment in lines[0]


def test_bad_config_exits_2_with_one_line_naming_the_field(tmp_path):
    f = tmp_path / "agent.yaml"
    f.write_text("sampling:\n  fast_interval_s: -1\n")
    p = run("agent", "--config", str(f), "--sim", "1")
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "sampling.fast_interval_s" in p.stderr
    p = run("check-config", str(f))
    assert p.returncode == 2 and "sampling.fast_interval_s" in p.stderr


def test_check_config_accepts_a_good_file(tmp_path, capsys):
    f = tmp_path / "agent.yaml"
    f.write_text("listen: 127.0.0.1:9999\n")
    assert main(["check-config", str(f)]) == 0
    assert "ok" in capsys.readouterr().out


def test_check_config_reads_the_http_clients_secret_files_as_the_daemon_does(tmp_path, capsys):
    missing = tmp_path / "no-such-password"
    agent = tmp_path / "agent.yaml"
    agent.write_text("alerting:\n  alertmanager: {urls: [http://am:9093], basic_auth: {username: gpumond, "
                     f"password_file: {missing}}}}}\n")
    rules = tmp_path / "rules.yaml"
    rules.write_text("allow_unauthenticated: true\ntelemetry:\n  scrape: {targets: [node:9480], authorization: "
                     f"{{credentials_file: {missing}}}}}\n")
    assert main(["check-config", str(agent)]) == 2
    assert f"alerting.alertmanager.basic_auth.password_file: cannot read {missing}" in capsys.readouterr().err
    assert main(["check-config", str(rules)]) == 2
    assert f"telemetry.scrape.authorization.credentials_file: cannot read {missing}" in capsys.readouterr().err
    slack = tmp_path / "slack-agent.yaml"
    slack.write_text("policy:\n  power_slack: {rules_url: http://rules:9481, authorization: "
                     f"{{credentials_file: {missing}}}}}\n")
    assert main(["check-config", str(slack)]) == 2
    assert f"policy.power_slack.authorization.credentials_file: cannot read {missing}" in capsys.readouterr().err
    missing.write_text("s3cret\n")
    assert main(["check-config", str(agent)]) == 0 and main(["check-config", str(rules)]) == 0
    assert main(["check-config", str(slack)]) == 0
    assert main(["check-config", "--shape-only", str(agent)]) == 0


def test_check_config_shape_only_lints_without_the_secret_files_and_says_which_check_ran(tmp_path, capsys,
                                                                                      monkeypatch):
    for name in list(os.environ):
        if name.startswith("GPUMOND_"):
            monkeypatch.delenv(name)
    rules = tmp_path / "rules.yaml"
    rules.write_text("tokens_file: /etc/gpumond/no-such-rules-tokens\n"
                     "alerting:\n  slack: {webhook_url_file: /etc/gpumond/no-such-webhook}\n")
    agent = tmp_path / "agent.yaml"
    agent.write_text("alerting:\n  pagerduty: {routing_key_file: /etc/gpumond/no-such-key}\n")
    # The full check reads the secrets as the daemon will, and fails where they are absent (a CI runner).
    assert main(["check-config", str(rules)]) == 2
    assert "tokens_file: cannot read /etc/gpumond/no-such-rules-tokens" in capsys.readouterr().err
    assert main(["check-config", str(agent)]) == 2
    assert "routing_key_file: cannot read /etc/gpumond/no-such-key" in capsys.readouterr().err
    assert main(["check-config", "--shape-only", str(rules)]) == 0
    out = capsys.readouterr().out
    assert "ok (rules config" in out and "shape only: no secret file or environment read" in out, out
    assert "alerts to log, slack" in out, out
    assert main(["check-config", "--shape-only", str(agent)]) == 0
    assert "shape only: no secret file or environment read" in capsys.readouterr().out
    # Shape still means shape: a typo fails either way.
    agent.write_text("sampling: {fast_intervall_s: 2}\n")
    assert main(["check-config", "--shape-only", str(agent)]) == 2
    assert "sampling.fast_intervall_s: unknown key" in capsys.readouterr().err
    agent.write_text("listen: 127.0.0.1:9999\n")
    assert main(["check-config", str(agent)]) == 0
    assert "full check: secret files and environment read" in capsys.readouterr().out


def test_bad_scenario_file_is_one_clear_line(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("faults:\n  - {gpu: 0, kind: coolng, at_s: 1}\n")
    p = run("agent", "--sim", "2", "--sim-scenario", str(f))
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "--sim-scenario" in p.stderr and "coolng" in p.stderr


def test_a_scenario_for_more_gpus_than_simulated_is_one_clear_line():
    p = run("agent", "--sim", "2", "--sim-scenario", "demo")  # the shipped demo plants faults on GPUs 1-3
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "GPU 3 does not exist" in p.stderr and "raise --sim" in p.stderr
    assert "--sim-scenario: demo.yaml: gpus[0].index" in p.stderr  # the file, as for every other scenario error


def test_a_scenario_without_sim_simulates_8_gpus_whatever_its_per_gpu_overrides():
    from gpumond.agent.backends import sim_backend
    from gpumond.cli.agent import _SCENARIO_DIR

    # the demo scenario overrides only GPU 3 and plants faults on GPUs 1-3: it used to build a node of 1 GPU
    backend = sim_backend(None, Path(_SCENARIO_DIR) / "demo.yaml", 1.0, "n1")
    assert len(backend.extra["sim"].gpus) == 8


def test_help_teaches_the_simulator():
    p = run("agent", "--help")
    assert p.returncode == 0 and "gpumond agent --sim 8" in p.stdout


# ----- the shipped examples and the help's examples work as written ---------------------------------
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "deploy" / "examples").glob("*.yaml"))


def clean_env() -> dict[str, str]:
    """The environment of an operator who has set no tokens."""
    return {k: v for k, v in os.environ.items() if k != TOKENS_ENV}


def test_both_examples_are_shipped() -> None:
    assert [p.name for p in EXAMPLES] == ["agent.yaml", "rules.yaml"]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_check_config_passes_on_the_shipped_example(example: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "gpumond.cli", "check-config", str(example)], capture_output=True,
                       text=True, timeout=60, env=clean_env(), cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"{example}: ok ({example.stem} config;")


def test_the_rules_example_runs_as_the_readme_says_and_is_the_defaults_but_its_dev_keys() -> None:
    example = REPO / "deploy" / "examples" / "rules.yaml"
    assert "gpumond rules --config deploy/examples/rules.yaml" in (REPO / "README.md").read_text()
    config = load_rules_config(example, env={})
    assert len(config.tokens) == 1 and "demo" in config.tokens[0]
    # What makes it run on a developer machine as it is: this machine only (the token is public), the agent
    # that `gpumond agent --sim 8` starts here, and the default state_dir left unset (in memory when unwritable).
    assert str(config.listen) == "127.0.0.1:9481" and config.telemetry.scrape.targets == ("127.0.0.1:9480",)
    assert "state_dir" not in config.model_fields_set
    default = RulesConfig.default()
    dev = {"tokens": (), "listen": default.listen, "telemetry": default.telemetry}
    assert config.model_copy(update=dev) == default
    assert "tokens_file: /etc/gpumond/" in example.read_text()  # the production way is shown


def help_scenario_examples() -> list[list[str]]:
    text = run("agent", "--help").stdout
    return [shlex.split(line.split("#")[0])[2:] for line in text.splitlines()
            if line.strip().startswith("gpumond agent") and "--sim-scenario" in line]


def test_the_help_sim_scenario_example_works_from_any_directory(tmp_path, monkeypatch) -> None:
    examples = help_scenario_examples()
    shipped = [args for args in examples if "/" not in args[args.index("--sim-scenario") + 1]]
    assert shipped, examples
    monkeypatch.chdir(tmp_path)
    for args in shipped:
        path = build_parser().parse_args(["agent", *args]).sim_scenario
        assert path.is_file() and path.is_relative_to(Path(gpumond.__file__).parent)
        assert load_scenario(path).faults


def test_the_agent_runs_a_shipped_scenario_from_a_temp_directory(tmp_path) -> None:
    port = free_port()
    (tmp_path / "agent.yaml").write_text(f"state_dir: {tmp_path / 'state'}\n")
    log = tmp_path / "agent.log"
    with log.open("w") as err:
        agent = subprocess.Popen([sys.executable, "-m", "gpumond.cli", "agent", "--config", "agent.yaml",
                                  "--listen", f"127.0.0.1:{port}", "--sim", "4", "--sim-scenario", "demo"],
                                 cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 30
        healthy = False
        while not healthy and agent.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
                    healthy = resp.status == 200
            except OSError:
                time.sleep(0.1)
        assert healthy, log.read_text()
    finally:
        agent.terminate()
        rc = agent.wait(timeout=15)
    assert rc == 0, log.read_text()
    assert f"scenario={Path(gpumond.__file__).parent / 'nvml' / 'sim' / 'scenarios' / 'demo.yaml'}" in log.read_text()


def test_the_agent_help_lists_the_shipped_scenarios() -> None:
    out = run("agent", "--help").stdout
    assert "--sim-scenario demo " in out
    assert "shipped scenarios" in out and "  demo " in out and "  healthy " in out


def test_an_unknown_scenario_name_is_one_line_naming_the_shipped_ones(tmp_path) -> None:
    p = subprocess.run([sys.executable, "-m", "gpumond.cli", "agent", "--sim", "1", "--sim-scenario", "dmeo"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "--sim-scenario: dmeo:" in p.stderr and "shipped: demo, healthy" in p.stderr


def test_a_scenario_file_in_the_working_directory_wins_over_a_shipped_name(tmp_path, monkeypatch) -> None:
    (tmp_path / "demo.yaml").write_text("faults: []\n")
    monkeypatch.chdir(tmp_path)
    assert build_parser().parse_args(["agent", "--sim-scenario", "demo.yaml"]).sim_scenario == Path("demo.yaml")


def test_every_repository_path_a_help_text_names_exists():
    # A newcomer copies the examples from --help; check-config's used to name deploy/rules.yaml, which is not here.
    import argparse
    import re

    root = Path(gpumond.__file__).resolve().parent.parent
    parser = build_parser()
    helps = [parser.format_help()]
    todo = [parser]
    while todo:
        for action in todo.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    helps.append(sub.format_help())
                    todo.append(sub)
    # `kubectl exec deploy/NAME` names a Kubernetes Deployment, not a file
    path = re.compile(r"(?<![\w/.~-])(?<!exec )((?:deploy|docs|dashboards|scripts|gpumond)/[\w./-]*\w)")
    named = {m for text in helps for m in path.findall(text)}
    assert "deploy/examples/rules.yaml" in named
    assert [path for path in sorted(named) if not (root / path).exists()] == []


def test_a_bare_gpumond_shows_the_commands_and_what_its_exit_status_means(capsys):
    # argparse alone says only "required: COMMAND"; someone typing `gpumond` wants to know what it does
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "demo" in err and "agent" in err and "check-config" in err
    assert "exit status: 0 done; 1 the work could not be done" in err


def _missing_keys(model: type, given: object, prefix: str = "") -> list[str]:
    """Dotted keys of `model` absent from the mapping `given`; nested sections the file gives are followed."""
    from pydantic import BaseModel

    if not isinstance(given, dict):
        return []
    missing = []
    for name, field in model.model_fields.items():
        if name not in given:
            missing.append(prefix + name)
        elif isinstance(field.default, BaseModel):
            missing += _missing_keys(type(field.default), given[name], f"{prefix}{name}.")
    return missing


def test_the_agent_example_lists_every_key() -> None:
    example = REPO / "deploy" / "examples" / "agent.yaml"
    assert "the values below are the defaults" in example.read_text()
    assert _missing_keys(AgentConfig, yaml.safe_load(example.read_text())) == []  # at their defaults: test_config_load


@pytest.mark.parametrize("daemon, extra, hint", [
    ("agent", ["--sim", "1"], "(is another agent running? choose another port with --listen)"),
    ("rules", [], "(choose another port with --listen)"),
])
def test_a_daemon_on_a_taken_port_exits_1_with_one_line_naming_it(daemon, extra, hint, tmp_path):
    import socket

    with socket.socket() as taken:  # bound and listening: the daemon's bind fails as it would on a live port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / f"{daemon}.yaml"
        config.write_text("allow_unauthenticated: true\n" if daemon == "rules" else "{}\n")
        p = run(daemon, "--config", str(config), "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path),
                "--log-level", "error", *extra)
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines == [f"gpumond: cannot listen on 127.0.0.1:{port}: Address already in use {hint}"], p.stderr


@pytest.mark.parametrize("daemon, daemon_module", [("agent", "gpumond.agent.app"), ("rules", "gpumond.rules.service")])
def test_a_bad_config_is_refused_before_the_daemon_is_loaded(daemon, daemon_module, tmp_path):
    # The refusal comes from the config alone: loading the daemon (numpy, the detectors) or the HTTP server
    # (uvicorn) first made the one line wait seconds on a busy host.
    bad = tmp_path / f"{daemon}.yaml"
    bad.write_text("listen: nowhere\n")
    probe = (f"import sys\nfrom gpumond.cli import main\nrc = main([{daemon!r}, '--config', {str(bad)!r}])\n"
             f"print(rc, *sorted({{{daemon_module!r}, 'uvicorn'}} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["2"], done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "listen" in done.stderr, done.stderr
