"""The node relay with real parts: `gpumond agent --sim` relaying real SDK processes to the real rules service.

Eight ranks step through the relay while the rules service restarts and then the agent (the relay) restarts:
every step a rank counts as pushed is one the service accepted, and nothing is dropped. A rank's early push
reaches the service at once, not at the relay's next interval.
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

from gpumond.config.rules import RulesConfig
from gpumond.job import Reporter
from gpumond.rules.http import build_app
from gpumond.rules.store import RankStore
from tests.fakes import FakeClock
from tests.integration.alert_helpers import RulesDaemon
from tests.integration.helpers import (LOOPBACK, AgentProcess, free_port, http_get, parse_metrics, served, value,
                                       wait_until)

pytestmark = pytest.mark.integration

TOKEN = "relay-test-token-0123456789"
RANKS = 8
RUN_S = 11.0
RATE = 4.0  # steps per second per rank
HERE = Path(__file__).parent


def accepted(rules: RulesDaemon) -> float:
    status, _, body = http_get(f"{rules.base_url}/metrics")
    assert status == 200
    return value(parse_metrics(body.decode()), "gpumond_rules_push_steps_total", result="accepted") or 0.0


def agent(workdir: Path, port: int, relay_port: int, rules_port: int, interval_s: float = 2.0) -> AgentProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "agent.json"
    # One state directory for both runs, as on a node: what a stopping relay could not deliver waits there.
    config.write_text(json.dumps({"policy": {"mode": "off"}, "state_dir": str(workdir.parent / "agent-state"),
                                  "relay": {"upstream": f"http://{LOOPBACK}:{rules_port}",
                                            "interval_s": interval_s}}))
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
        # Until the first service has taken a batch (a fixed wait lost that race on a loaded machine: the ranks'
        # start-up and first push can miss the relay's first rounds).
        wait_until(lambda: accepted(first_rules) > 0, timeout=30, what="the first rules service to take a batch")
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
        time.sleep(1.5)
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


def held(store: RankStore, job: str) -> int:
    """Steps the rules service holds of the job's rank 0."""
    window = store.jobs(time.time()).get(job, {}).get(0)
    return 0 if window is None else len(window.steps)


def test_an_early_push_reaches_the_service_at_once_through_the_relay(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank's regular push waits at the relay for its 30 s interval; the step that stands out is pushed early and
    takes the job's held steps with it to the rules service within seconds, by the agent's own scheduler."""
    for name in [n for n in os.environ if n.startswith("GPUMOND_")]:
        monkeypatch.delenv(name)
    config = RulesConfig.model_validate({"tokens": [TOKEN]})
    store = RankStore.from_config(config)
    app = build_app(config=config, rank_store=store, findings=lambda: [], metrics=lambda: b"",
                    ready=lambda: (True, "ready"), clock=time.time)
    clock = FakeClock(100.0)
    started_wall = time.time() - 30.0  # the steps ended moments ago on the service's clock
    with served(app) as url:
        relay_port = free_port()
        with agent(tmp_path / "agent", free_port(), relay_port, int(url.rsplit(":", 1)[1]), interval_s=30.0):
            rep = Reporter(relay=f"http://{LOOPBACK}:{relay_port}", token=TOKEN, job="early-job", rank=0,
                           world_size=1, node="n", gpu_uuid="GPU-00000000-0000-0000-0000-000000000000",
                           push_interval_s=3600.0, clock=clock, wall=lambda: started_wall + clock.now - 100.0,
                           handle_sigterm=False)
            try:
                assert rep.enabled and rep._pusher is not None, rep.stats.last_error
                for _ in range(10):
                    clock.advance(0.2)
                    rep.step_end()
                assert rep._pusher.drain(2.0) is None  # a regular push: the relay holds it for its interval
                clock.advance(0.4)
                rep.step_end()  # stands out: pushed early, and forwarded at once
                wait_until(lambda: held(store, "early-job") == 11, timeout=5.0,
                           what="the early push to reach the rules service (the relay's interval: 30 s)")
                assert rep._pusher.early == 1
            finally:
                rep.close(timeout_s=0)
