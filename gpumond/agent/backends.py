"""Choosing where NVML comes from: the driver, or the simulator (only when asked for explicitly)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from gpumond.agent.app import Backend

log = logging.getLogger("gpumond.agent")


class BackendError(RuntimeError):
    """The requested backend cannot be built; the message names the flag or file at fault."""


def real_backend() -> Backend:
    """The NVIDIA driver through nvidia-ml-py; if it is absent the agent says so and keeps retrying."""
    return Backend("nvml", clock=time.monotonic)


def sim_backend(gpus: int | None, scenario_path: Path | None, speed: float, node: str) -> Backend:
    """Simulated GPUs below pynvml; chosen by --sim / --sim-scenario, logged loudly."""
    from gpumond.nvml.sim import ScenarioError, SimClock, SimulatedNvml, load_scenario

    scenario = None
    if scenario_path is not None:
        try:
            scenario = load_scenario(scenario_path)
        except ScenarioError as e:
            raise BackendError(f"--sim-scenario: {e}") from None
    # `gpus:` in a scenario holds per-GPU overrides, not the node's GPUs: without --sim, a node of 8
    count = gpus or 8
    clock = SimClock(speed=speed)
    try:
        sim = SimulatedNvml(gpu_count=count, node=node, scenario=scenario, clock=clock,
                            scenario_name=scenario_path.name if scenario_path is not None else None)
    except ScenarioError as e:  # e.g. a fault on GPU 3 of a two-GPU --sim
        raise BackendError(f"--sim-scenario: {e} (raise --sim or edit the scenario)") from None
    log.warning("running on SIMULATED GPUs (--sim): no real NVML is read",
                extra={"gpus": count, "speed": speed, "scenario": str(scenario_path) if scenario_path else None})
    return Backend("sim", install=sim.install, uninstall=sim.uninstall, clock=clock.now, speed=speed,
                   extra={"sim": sim})
