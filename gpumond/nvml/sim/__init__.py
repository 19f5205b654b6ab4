"""Simulated NVML: GPUs with a thermal/power model and scripted faults, below pynvml.

    sim = SimulatedNvml(gpu_count=8, scenario=load_scenario("demo.yaml"))
    sim.install()          # pynvml now talks to the simulated library
    pynvml.nvmlInit()

See docs/simulator.md for what is modelled and the scenario format.
"""

from .clock import ManualClock, SimClock
from .gpu import SimGpu
from .models import MODELS, GpuModelSpec
from .scenario import FAULT_KINDS, Fault, InletProfile, LoadPattern, Scenario, ScenarioError, load_scenario
from .simulator import SimulatedNvml

__all__ = [
    "FAULT_KINDS",
    "MODELS",
    "Fault",
    "GpuModelSpec",
    "InletProfile",
    "LoadPattern",
    "ManualClock",
    "Scenario",
    "ScenarioError",
    "SimClock",
    "SimGpu",
    "SimulatedNvml",
    "load_scenario",
]
