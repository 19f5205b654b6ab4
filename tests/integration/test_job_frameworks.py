"""The Lightning and Hugging Face Trainer integrations, for real: a tiny model trained by each framework on 2
processes (torchrun, gloo, CPU) with gpumond's callback, pushing to a live rules service.

Rank 1 is planted slow (20 ms more per step). What must show: both ranks' steps arrive, with comm waits
(the service reports a compute share only for ranks that push them), and the fast rank, which waits for
the slow one in the gradient all-reduce, has the smaller compute share. Bounded: 30 steps each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.integration.alert_helpers import TOKEN, RulesDaemon
from tests.integration.helpers import LOOPBACK, free_port, http_get, parse_metrics, wait_until

pytestmark = pytest.mark.integration
WORKER = Path(__file__).with_name("framework_worker.py")
STEPS = 30


def _shares(rules: RulesDaemon, job: str) -> dict[str, float]:
    status, _, body = http_get(f"{rules.url}/metrics")
    assert status == 200
    fam = parse_metrics(body.decode()).get("gpumond_job_rank_compute_ratio")
    return {s.labels["rank"]: s.value for s in (fam.samples if fam else []) if s.labels.get("job") == job}


class _Watch:
    """Polls /metrics while the job runs and keeps the last reading with both ranks' compute share: the final
    push at the end of training releases the job, and its per-rank series with it."""

    def __init__(self, rules: RulesDaemon, job: str) -> None:
        self.latest: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(rules, job), daemon=True)
        self._thread.start()

    def _run(self, rules: RulesDaemon, job: str) -> None:
        while not self._stop.wait(0.2):
            try:
                shares = _shares(rules, job)
            except Exception:  # a scrape that fails mid-run is retried at the next tick
                continue
            if len(shares) == 2:
                self.latest = shares

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(5)
        return self.latest


def _ended(rules: RulesDaemon) -> float:
    fam = parse_metrics(http_get(f"{rules.url}/metrics")[2].decode()).get("gpumond_rules_jobs_ended")
    return sum(s.value for s in (fam.samples if fam else []) if s.name.endswith("_total"))


def _accepted(rules: RulesDaemon) -> float:
    fam = parse_metrics(http_get(f"{rules.url}/metrics")[2].decode())["gpumond_rules_push_steps"]
    return sum(s.value for s in fam.samples if s.name.endswith("_total") and s.labels.get("result") == "accepted")


@pytest.mark.parametrize("framework, module", [("lightning", "lightning"), ("hf", "transformers")])
def test_a_framework_run_reports_both_ranks_steps_and_comm_waits(tmp_path: Path, framework: str,
                                                                   module: str) -> None:
    pytest.importorskip(module, reason=f"pip install -e '.[{framework}]' (scripts/test.sh installs it)")
    rules = RulesDaemon(tmp_path, {"tokens": [TOKEN], "evaluation_interval_s": 0.5,
                                   "state_dir": str(tmp_path / "state")}).start()
    job = f"{framework}-job"
    watch = _Watch(rules, job)
    try:
        env = {**os.environ, "GPUMOND_ENDPOINT": rules.url, "GPUMOND_TOKEN": TOKEN, "GPUMOND_JOB_ID": job,
               "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
               "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                              "--master-addr", LOOPBACK,
                              "--master-port", str(free_port()), str(WORKER), framework, str(tmp_path), str(STEPS)],
                             env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-4000:]
        for rank in (0, 1):
            got = json.loads((tmp_path / f"rank-{rank}.json").read_text())
            assert got["timed"], got  # the callback found the DDP model the framework made
            assert got["pushed_steps"] == STEPS and got["dropped_steps"] == 0 and got["last_error"] is None, got
        assert _accepted(rules) == 2 * STEPS
        # both ranks' final pushes (the callback closes the reporter at the end of training) end the job
        wait_until(lambda: _ended(rules) == 1, timeout=30, what="the job's end on /metrics")
        shares = watch.stop()
        assert len(shares) == 2, f"no evaluation saw both ranks' compute share while the job ran: {shares}"
        assert shares["0"] < shares["1"], shares  # the fast rank waits for the slow one
    finally:
        watch.stop()
        rules.stop()
