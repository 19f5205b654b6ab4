"""The whole /metrics text for a fixed scenario, diffed against a golden file (node_exporter's end-to-end idea).

Regenerate after an intended change with:  GPUMOND_UPDATE_GOLDEN=1 python -m pytest tests/contract/test_golden_exposition.py
"""

import os
import time
from pathlib import Path

from tests.agent_sampler import node_sampler
from gpumond.nvml.events import XidWatcher
from gpumond.nvml.session import NvmlSession
from gpumond.nvml.sim import ManualClock, Scenario, SimulatedNvml

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "agent_metrics.txt"

SCENARIO = {
    "gpus": [{"index": 1, "model": "v100-sxm2"}],
    "default_load": {"pattern": "constant", "utilization": 0.9},
    "faults": [
        {"gpu": 0, "kind": "cooling", "factor": 1.5, "at_s": 0},
        {"gpu": 0, "kind": "ecc_uncorrected", "count": 2, "at_s": 10},
        {"gpu": 0, "kind": "ecc_corrected", "count": 5, "at_s": 10},
        {"gpu": 2, "kind": "lost", "at_s": 20},
        {"gpu": 3, "kind": "nvml_error", "function": "nvmlDeviceGetTotalEnergyConsumption",
         "error": "not_supported", "at_s": 0},
        {"gpu": 3, "kind": "pcie_replay", "count": 7, "at_s": 5},
        {"gpu": 3, "kind": "nvlink_degraded", "link": 1, "rate": 100, "at_s": 30},
        {"gpu": 3, "kind": "nvlink_down", "link": 4, "at_s": 40},
        {"gpu": 3, "kind": "busy_idle", "at_s": 50},
    ],
}


def render_fixed_scenario() -> str:
    clock = ManualClock()
    sim = SimulatedNvml(gpu_count=4, node="golden-node", clock=clock, seed=7,
                        scenario=Scenario.model_validate(SCENARIO))
    session = NvmlSession(install=sim.install, clock=clock.now)
    session.open()
    xid = XidWatcher(session.handles, session.index_of_handle, wait_ms=20)
    xid.start()
    try:
        sampler = node_sampler(session, hostname="golden-node", xid=xid, timer=lambda: 0.0, clock=lambda: 0.0)
        sampler.slow_cycle()
        for _ in range(60):
            clock.advance(1)
            sampler.fast_cycle()
        sim.inject({"kind": "xid", "gpu": 0, "code": 48})
        deadline = time.monotonic() + 5
        while xid.counts() != {(0, 48): 1, (2, 79): 1} and time.monotonic() < deadline:
            time.sleep(0.02)
        sampler.slow_cycle()
        clock.advance(1)  # GPM's rates need time between this cycle's sample and the last one's
        return sampler.fast_cycle().plain.decode()
    finally:
        xid.stop()
        session.close()
        sim.uninstall()


def test_exposition_matches_golden_file():
    text = render_fixed_scenario()
    if os.environ.get("GPUMOND_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "exposition changed; if intended regenerate (see module docstring)"
