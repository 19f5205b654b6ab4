"""The benchmarks still run (their --quick modes): a benchmark that rots is a result nobody can reproduce.

Not here: ddp_overhead.py and ddp_signal.py (real torch DDP; their quick modes take minutes on two shared
cores, and ddp_job.py / ddp_e2e.py are run by test_job_torch*.py), rules_ingest.py (needs wrk and
prometheus-pushgateway, which the test machines do not install), alert_delivery.py (~2 min; see its own
--quick). A quick run writes only the git-ignored
results/<name>_quick.md.
"""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv, expect", [
    (["benchmarks/agent_sample_cycle.py", "--quick"], "bare pynvml loop"),
    (["benchmarks/thermal_policy.py", "--quick"], "gpumond"),
    (["-m", "benchmarks.detection.run", "--quick", "--no-scaling"], "straggler"),
    (["benchmarks/pod_attribution.py", "--quick"], "Pod-resources adds"),
    (["benchmarks/sdk_overhead.py", "--quick"], "Job SDK overhead per training step"),
    (["benchmarks/agent_rss.py", "--quick"], "Agent RSS over a long accelerated run"),
    (["benchmarks/agent_serving.py", "--quick"], "Serving /metrics for 8 GPUs"),
    (["benchmarks/hostile_network.py", "--quick"], "Hostile network (quick)"),
    (["benchmarks/tls_cost.py", "--quick"], "scrape, new connection"),
    (["benchmarks/remediation_step.py", "--quick"], "Remediation step"),
    (["benchmarks/rules_store.py", "--quick"], "RSS per held step"),
    (["benchmarks/fleet_scale.py", "--quick"], "planted found"),
])
def test_benchmark_quick_mode_runs(argv, expect):
    p = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    assert expect in p.stdout + p.stderr
