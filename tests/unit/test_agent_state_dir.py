"""Where an agent keeps its state: the configured state_dir, or for a simulated node a directory of its own run."""

from __future__ import annotations

from pathlib import Path

from gpumond.agent.app import Backend, state_dir_for
from gpumond.config import AgentConfig


def test_a_simulated_node_without_a_state_dir_never_sees_an_earlier_runs_state() -> None:
    # The simulation starts again from zero each run; restoring the last run's alerts would page about GPUs
    # that are fine (seen by a newcomer: an XID 79 "GPU fell off the bus" at the start of a fresh --sim).
    cfg = AgentConfig.model_validate({"node_name": "sim-node"})
    sim = Backend("sim")
    first, own1 = state_dir_for(cfg, sim)
    second, own2 = state_dir_for(cfg, sim)
    try:
        assert own1 and own2 and first != second
        assert first.is_dir() and not any(first.iterdir())
    finally:
        first.rmdir()
        second.rmdir()


def test_a_configured_state_dir_is_used_as_it_is(tmp_path: Path) -> None:
    cfg = AgentConfig.model_validate({"state_dir": str(tmp_path)})
    assert state_dir_for(cfg, Backend("sim")) == (tmp_path, False)
    assert state_dir_for(cfg, Backend("nvml")) == (tmp_path, False)
