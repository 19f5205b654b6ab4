"""The benchmarks still run (their --quick modes): a benchmark that rots is a result nobody can reproduce.

rules_ingest.py needs wrk and prometheus-pushgateway (Debian packages): skipped where they are not installed.
A quick run writes only the git-ignored results/<name>_quick.md.
"""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
TORCH = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (pip install torch==2.13.0)")
WRK_AND_PUSHGATEWAY = pytest.mark.skipif(
    shutil.which("wrk") is None or shutil.which("prometheus-pushgateway") is None,
    reason="needs wrk and prometheus-pushgateway (Debian packages)")


@pytest.mark.parametrize("argv, expect", [
    (["benchmarks/agent_sample_cycle.py", "--quick"], "bare pynvml loop"),
    (["benchmarks/thermal_policy.py", "--quick"], "gpumond"),
    (["benchmarks/energy_slack.py", "--quick"], "unbalanced pipeline"),
    (["benchmarks/energy_cycle.py", "--quick"], "Ratio of medians"),
    (["-m", "benchmarks.detection.run", "--quick", "--no-scaling"], "straggler"),
    (["-m", "benchmarks.detection.gpm", "--quick"], "with GPM"),
    (["-m", "benchmarks.detection.fault_free", "--quick"], "95 % upper bound per job-day"),
    (["-m", "benchmarks.detection.long_look_null", "--quick"], "threshold + 1"),
    (["-m", "benchmarks.detection.transient_runs", "--quick"], "what the minimum duration must outlast"),
    (["benchmarks/sdk_overhead.py", "--quick"], "Job SDK overhead per training step"),
    (["benchmarks/agent_rss.py", "--quick"], "Agent RSS over a long accelerated run"),
    (["benchmarks/agent_serving.py", "--quick"], "Serving /metrics for 8 GPUs"),
    (["benchmarks/remediation_step.py", "--quick"], "Remediation step"),
    (["benchmarks/rules_store.py", "--quick"], "RSS per held step"),
    (["benchmarks/relay_batch_cost.py", "--quick"], "less CPU per step"),
    (["benchmarks/eval_cycle.py", "--quick"], "pushes 65,536/s"),
    (["benchmarks/eval_phases.py", "--quick"], "the parts that read the window grew by"),
    (["benchmarks/fleet_scale.py", "--quick"], "planted found"),
    (["benchmarks/relay_scale.py", "--quick"], "ingest CPU relay ÷ direct"),
    (["benchmarks/fleet_scale.py", "--quick", "--fetch-only", "--cycles", "2"], "throttle bitmask `!= 0`"),
    pytest.param(["benchmarks/ddp_overhead.py", "--quick"], "gpumond vs plain", marks=TORCH),
    pytest.param(["benchmarks/ddp_signal.py", "--quick"], "rank 1 slowed", marks=TORCH),
    pytest.param(["benchmarks/fsdp_signal.py", "--quick"], "forward all-gathers", marks=TORCH),
    pytest.param(["benchmarks/ddp_e2e.py", "--quick"], "| clean | none |", marks=TORCH),
    pytest.param(["benchmarks/rules_ingest.py", "--quick"], "Paced at", marks=WRK_AND_PUSHGATEWAY),
], ids=lambda v: (v[1] if v[0] == "-m" else Path(v[0]).stem) if isinstance(v, list) else "")
def test_benchmark_quick_mode_runs(argv, expect):
    p = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    assert expect in p.stdout + p.stderr
