"""The node relay with real parts: `gpumond agent --sim` relaying real SDK processes to the real rules service.

Eight ranks step through the relay while the rules service restarts and then the agent (the relay) restarts:
every step a rank counts as pushed is one the service accepted, and nothing is dropped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.alert_helpers import RulesDaemon
from tests.integration.helpers import LOOPBACK, AgentProcess, free_port, http_get, parse_metrics, value, wait_until

pytestmark = pytest.mark.integration

TOKEN = "relay-test-token-0123456789"
RANKS = 8
RUN_S = 14.0
RATE = 4.0  # steps per second per rank
HERE = Path(__file__).parent


def accepted(rules: RulesDaemon) -> float:
    status, _, body = http_get(f"{rules.base_url}/metrics")
    assert status == 200
    return value(parse_metrics(body.decode()), "gpumond_rules_push_steps_total", result="accepted") or 0.0


def agent(workdir: Path, port: int, relay_port: int, rules_port: int) -> AgentProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "agent.json"
    config.write_text(json.dumps({"policy": {"mode": "off"}, "state_dir": str(workdir / "state"),
                                  "relay": {"upstream": f"http://{LOOPBACK}:{rules_port}", "interval_s": 2.0}}))
    return AgentProcess(["--sim", "2", "--config", config, "--relay-listen", f"{LOOPBACK}:{relay_port}"],
                        workdir, port=port)


def rules(workdir: Path, port: int) -> RulesDaemon:
    return RulesDaemon(workdir, {"tokens": [TOKEN], "state_dir": str(workdir / "state")}, port=port)


def test_no_step_is_lost_across_a_rules_restart_and_a_relay_restart(tmp_path: Path) -> None:
    rules_port, agent_port, relay_port = free_port(), free_port(), free_port()
    first_rules = rules(tmp_path / "rules-1", rules_port).start()
    first_agent = agent(tmp_path / "agent-1", agent_port, relay_port, rules_port).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMOND_")}
    env.update({"GPUMOND_RELAY": f"http://{LOOPBACK}:{relay_port}", "GPUMOND_TOKEN": TOKEN,
                "GPUMOND_JOB_ID": "relayed-job", "PYTHONUNBUFFERED": "1"})
    ranks = [subprocess.Popen([sys.executable, str(HERE / "relay_rank.py"), str(r), str(RANKS), str(RUN_S), str(RATE)],
                              env={**env, "GPUMOND_GPU_UUID": f"GPU-00000000-0000-0000-0000-{r:012x}"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(RANKS)]
    second_rules = second_agent = None
    try:
        time.sleep(3.0)
        # The rules service restarts. The relay is frozen while the first service's count is read, so that no batch
        # lands between the reading and the stop; its ranks meanwhile hold their steps (no direct endpoint is set).
        first_agent.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
        time.sleep(0.5)
        before_restart = accepted(first_rules)
        assert first_rules.stop() == 0
        first_agent.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        assert before_restart > 0
        time.sleep(1.0)  # an outage the relay rides out, holding what its ranks hand over
        second_rules = rules(tmp_path / "rules-2", rules_port).start()
        time.sleep(2.0)
        # The relay restarts: it delivers what it holds as it stops; its ranks keep theirs until it answers again.
        assert first_agent.stop() == 0
        second_agent = agent(tmp_path / "agent-2", agent_port, relay_port, rules_port).start()
        outputs = [p.communicate(timeout=60) for p in ranks]
        results = [json.loads(out.decode().strip().splitlines()[-1]) for out, _ in outputs]
        pushed = sum(r["pushed"] for r in results)
        assert all(r["dropped"] == 0 and r["queued"] == 0 for r in results), results
        assert pushed == sum(r["recorded"] for r in results)
        wait_until(lambda: before_restart + accepted(second_rules) >= pushed, timeout=20,
                   what="the relay to deliver every step it took")
        time.sleep(1.0)
        assert before_restart + accepted(second_rules) == pushed  # not one step more either (no double count)
        metrics = second_agent.metrics()
        assert value(metrics, "gpumond_relay_steps_dropped_total", reason="buffer_full") == 0
        assert "relay stopping with pushes not delivered" not in first_agent.stderr()
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for proc in (second_agent, second_rules, first_agent, first_rules):
            if proc is not None and proc.proc is not None:
                proc.stop()
