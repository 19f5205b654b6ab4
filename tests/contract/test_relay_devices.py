"""The relay finds a rank's GPU or MIG slice from NVML's compute processes, read through real pynvml over the
simulated NVML: this process's own PID (and its PID as /proc names it) stands for the rank's."""

from __future__ import annotations

import os

from gpumond.agent.relay import session_devices
from gpumond.agent.relay.fill import Filler
from gpumond.agent.relay.processes import ProcessDevices
from gpumond.nvml.sim import Scenario

MIG = Scenario.model_validate({"gpus": [{"index": 1, "mig": ["3g.40gb", "4g.40gb"]}]})


def test_a_rank_on_a_gpu_and_a_rank_on_a_mig_slice_are_found_by_pid(make_session) -> None:
    sim, session, clock = make_session(gpus=2, scenario=MIG)
    me = os.getpid()
    sim.set_processes(0, [me])
    sim.set_mig_processes(1, 1, [4242])
    devices = ProcessDevices(session_devices(session), clock.now)
    assert devices.device_of(me) == (sim.gpus[0].uuid, me)
    assert devices.device_of(4242) == (sim.gpus[1].mig[1].uuid, 4242)
    who = Filler("node-a", devices).fill(job="j", node=None, gpu_uuid=None, pid=4242)
    assert who.gpu_uuid == sim.gpus[1].mig[1].uuid and who.node == "node-a"
