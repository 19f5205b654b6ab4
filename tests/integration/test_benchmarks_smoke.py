"""The benchmarks still run (their --quick modes): a benchmark that rots is a result nobody can reproduce."""

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
    (["benchmarks/tls_cost.py", "--quick"], "scrape, new connection"),
    (["benchmarks/remediation_step.py", "--quick"], "Remediation step"),
])
def test_benchmark_quick_mode_runs(argv, expect):
    p = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    assert expect in p.stdout + p.stderr
