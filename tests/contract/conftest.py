import pynvml
import pytest

from gpumond.nvml.session import NvmlSession
from gpumond.nvml.sim import ManualClock, SimulatedNvml


@pytest.fixture
def make_session():
    """Factory: a session over a fresh simulated NVML on a manual clock; torn down after the test."""
    made = []

    def make(gpus=4, **sim_kwargs):
        clock = sim_kwargs.pop("clock", None) or ManualClock()
        sim = SimulatedNvml(gpu_count=gpus, node="test-node", clock=clock, **sim_kwargs)
        session = NvmlSession(install=sim.install, clock=clock.now, retry_max_s=60)
        made.append((sim, session))
        session.open()
        return sim, session, clock

    yield make
    for sim, session in made:
        session.close()
        sim.uninstall()


@pytest.fixture
def make_sim():
    """Factory: a simulated NVML (3 GPUs, a manual clock unless given) under pynvml, initialised unless
    init=False; uninstalled after the test."""
    installed = []

    def make(gpus=3, init=True, **sim_kwargs):
        sim_kwargs.setdefault("clock", ManualClock())
        sim = SimulatedNvml(gpu_count=gpus, **sim_kwargs).install()
        installed.append(sim)
        if init:
            pynvml.nvmlInit()
        return sim

    yield make
    for sim in installed:
        sim.uninstall()


@pytest.fixture
def rigs():
    """The policy rigs a test made (tests/contract/policy_rig.py's `make`), closed after it."""
    made = []
    yield made
    for r in made:
        r.close()
