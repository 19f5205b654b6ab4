"""`gpumond demo` end to end: agents on simulated GPUs, job pushes over HTTP through the real SDK, the rules
service scraping the agents — the planted faults come out as the right findings and alerts."""

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_demo_finds_every_planted_fault():
    p = subprocess.run([sys.executable, "-m", "gpumond.cli", "demo", "--nodes", "3", "--duration", "80",
                        "--speed", "2"], capture_output=True, text=True, timeout=240)
    out = p.stdout
    assert p.returncode == 0, p.stderr[-2000:]
    firing = set(re.findall(r"FINDING FIRING\s+(\S+) job=\S+ (?:node=(\S+) )?(?:rank=(\d+))?", out))
    # node 1 GPU 3 loses cooling → capped → slower clock: rank 11 straggles; rank 21's loader starves
    assert ("straggler", "demo-node-01", "11") in firing, out
    assert ("io_starved_rank", "demo-node-02", "21") in firing, out
    assert not [f for f in firing if f[0] == "straggler" and f[2] != "11"], out  # no innocent rank blamed
    assert "ALERT  critical GpuXidCritical XID 48 on demo-node-00 GPU 6" in out
    assert re.search(r"demo-node-01 GPU 3: power limit 700 W → \d+ W \(thermal capping", out)
