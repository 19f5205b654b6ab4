"""A node in-process for the policy contract tests: simulated GPUs under the real pynvml, the session, and a
policy engine on the simulated clock (test_policy_scenarios.py, test_policy_records.py). The `rigs` fixture that
closes them is in conftest.py.
"""

import json

from gpumond.state.audit import AuditLog
from gpumond.agent.policy.engine import PolicyEngine
from gpumond.agent.policy.state_file import StateFile
from gpumond.agent.policy.view import build_views
from gpumond.config import PolicyConfig
from gpumond.nvml.session import NvmlSession
from gpumond.nvml.sim import ManualClock, Scenario, SimulatedNvml


class Rig:
    """A node in-process: simulated GPUs, the session, and a policy engine on the simulated clock."""

    def __init__(self, tmp_path, gpus=2, policy=None, scenario=None, allow_set=True, sim=None, clock=None,
                 state_write=None, audit_opener=None, leases=None):
        self.clock = clock or ManualClock()
        self.sim = sim or SimulatedNvml(gpu_count=gpus, node="policy-node", clock=self.clock, allow_set=allow_set,
                                        scenario=Scenario.model_validate(scenario or {}))
        self.session = NvmlSession(install=self.sim.install, clock=self.clock.now)
        self.session.open()
        self.tmp = tmp_path
        self.audit_path = tmp_path / "audit.jsonl"
        state_file = StateFile(tmp_path / "state.json", **({"write": state_write} if state_write else {}))
        audit = AuditLog(self.audit_path, **({"opener": audit_opener} if audit_opener else {}))
        # These scenarios are about acting: enforce unless the test names another mode (the default is dry_run).
        config = PolicyConfig.model_validate({"mode": "enforce", **(policy or {})})
        self.engine = PolicyEngine(config, self.session, node="policy-node", state_file=state_file, audit=audit,
                                   clock=self.clock.now, leases=leases)
        self.slow = self.session.read("slow")
        self.t = 0
        self.series = []

    def run(self, seconds, xids=None):
        for _ in range(int(seconds)):
            self.clock.advance(1)
            self.t += 1
            if self.t % 30 == 0:
                self.slow = self.session.read("slow")
            self.series = self.engine.cycle(build_views(self.session.read("fast"), self.slow), xids or {})
        return self

    def audit(self):
        return [json.loads(line) for line in self.audit_path.read_text().splitlines()]

    def value(self, name, **labels):
        for s in self.series:
            if s.name == name and all(dict(s.labels).get(k) == v for k, v in labels.items()):
                return s.value
        return None

    def close(self):
        self.session.close()
        self.sim.uninstall()


def make(rigs, *a, **kw):
    r = Rig(*a, **kw)
    rigs.append(r)
    return r


HOT = {"faults": [{"gpu": 0, "kind": "cooling", "factor": 1.6, "at_s": 0}]}
