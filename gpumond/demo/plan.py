"""What the demo plants, where and when: one place to read the story the demo tells.

Times are demo seconds since the agents started, the same at any --speed: --speed runs the simulated GPUs'
physics faster (heating, the thermal controller, alert holds), while the training job and the rules service
run in real time, so the story's beats stay where a reader can follow them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpumond.demo.story import Place, Planted

JOB = "demo-llama-8b"
GPUS_PER_NODE = 8


@dataclass(frozen=True, slots=True)
class DemoPlan:
    """The demo cluster and its faults; each fault ends at a set time so the story can end too."""

    nodes: int = 4
    # This GPU's cold plate clogs (thermal resistance × hot_factor): the thermal policy caps its power, its
    # clock drops, and the job waits for its rank (a straggler). When cooling returns, the cap gives power
    # back after a minute of headroom (the controller is slow to give back by design).
    hot_node: int = 1
    hot_gpu: int = 3
    hot_factor: float = 2.5
    hot_at_s: float = 4.0
    hot_end_s: float = 24.0
    # This rank's data loader stalls for `starved_wait_frac` of each step; its GPU idles meanwhile. The stall
    # is a sleep in the loader (like a slow network-storage read): it loads neither CPU nor local disk.
    starved_node: int = 2
    starved_gpu: int = 5
    starved_at_s: float = 10.0
    starved_end_s: float = 38.0
    starved_wait_frac: float = 0.35
    # An XID 48 (double-bit ECC error) with one uncorrected ECC error: the agent alerts at once; the alerts
    # hold for `event_hold_s` simulated seconds, and the pending row remap stays until the GPU is reset.
    xid_node: int = 0
    xid_gpu: int = 6
    xid_at_s: float = 40.0
    event_hold_s: float = 30.0
    step_s: float = 0.25  # one training step's compute time at full clock
    # The demo's story is the cap acting on the hot GPU, so its agents enforce (on simulated GPUs only); an
    # installed agent defaults to dry_run.
    policy_mode: str = "enforce"

    def node_name(self, i: int) -> str:
        """Node names as the agents and the job report them."""
        return f"demo-node-{i:02d}"

    def rank_of(self, node: int, gpu: int) -> int:
        """The job's rank on (node, gpu): ranks fill nodes in order."""
        return node * GPUS_PER_NODE + gpu

    def place(self, node: int, gpu: int) -> Place:
        """A GPU of the plan as a story place."""
        return Place(self.node_name(node), gpu, self.rank_of(node, gpu))

    def scenario(self, node: int, speed: float) -> dict[str, object]:
        """The simulator scenario for one node's agent (simulated seconds: demo seconds × speed)."""
        faults: list[dict[str, object]] = []
        if node == self.hot_node:
            faults.append({"gpu": self.hot_gpu, "kind": "cooling", "factor": self.hot_factor,
                           "at_s": self.hot_at_s * speed, "duration_s": (self.hot_end_s - self.hot_at_s) * speed})
        if node == self.starved_node:
            # A starved GPU computes only between batches: utilization and power drop by the wait.
            faults.append({"gpu": self.starved_gpu, "kind": "load", "pattern": "constant",
                           "utilization": round(0.97 * (1 - self.starved_wait_frac), 3),
                           "at_s": self.starved_at_s * speed,
                           "duration_s": (self.starved_end_s - self.starved_at_s) * speed})
        if node == self.xid_node:
            faults += [{"gpu": self.xid_gpu, "kind": "xid", "code": 48, "at_s": self.xid_at_s * speed},
                       {"gpu": self.xid_gpu, "kind": "ecc_uncorrected", "count": 1, "at_s": self.xid_at_s * speed}]
        return {"default_load": {"pattern": "constant", "utilization": 0.97}, "faults": faults}

    def agent_config(self, state_dir: Path) -> dict[str, object]:
        """The agents' config: fast sampling, a short event hold, and a thermal cap that gives back in big steps
        (once the controller's minute of headroom has passed) so the cap clears within the demo.

        The policy enforces: the demo's GPUs are simulated, and the story is the cap acting on the hot GPU. A
        real agent defaults to dry_run; this `mode: enforce` is the one line an operator writes to let it act.
        """
        return {"state_dir": str(state_dir), "sampling": {"fast_interval_s": 1, "slow_interval_s": 5},
                "policy": {"mode": self.policy_mode, "alerts": {"event_hold_s": self.event_hold_s},
                           "thermal": {"step_w": 100, "interval_s": 2}}}

    def data_wait_s(self) -> float:
        """The starved loader's wait per step, so that it is `starved_wait_frac` of the step."""
        return self.step_s * self.starved_wait_frac / (1 - self.starved_wait_frac)

    def faults(self) -> tuple[Planted, ...]:
        """The planted faults as the story tells them, with the signals that mean each was found."""
        return (
            Planted("cooling", f"loses cooling {self.hot_at_s:.0f}–{self.hot_end_s:.0f} s "
                               f"(thermal resistance ×{self.hot_factor:g})",
                    self.place(self.hot_node, self.hot_gpu), self.hot_at_s, self.hot_end_s,
                    expect=("action:thermal_cap", "finding:straggler"),
                    related=("finding:job_slowdown", "finding:straggler_node", "alert:GpuSwThermalSlowdown",
                             "alert:GpuHwThermalSlowdown", "alert:GpuHwSlowdown", "alert:GpuPowerCapAtFloor"),
                    hint="the agent caps its power, so its clock drops and the job waits for rank "
                         f"{self.rank_of(self.hot_node, self.hot_gpu)}: finding straggler; after cooling returns "
                         "the cap gives power back once it has had a minute of headroom"),
            Planted("loader", f"data loader stalls {self.starved_at_s:.0f}–{self.starved_end_s:.0f} s "
                              f"({self.starved_wait_frac * 100:.0f} % of each step)",
                    self.place(self.starved_node, self.starved_gpu), self.starved_at_s, self.starved_end_s,
                    expect=("finding:io_starved_rank",), related=("finding:job_slowdown",),
                    hint="finding io_starved_rank. Host evidence is this machine's real CPU and iowait (every "
                         "simulated node shares it); the stall is a sleep that loads neither, so the likely "
                         "cause should read: no CPU or disk contention on the host (CPU, if something else keeps "
                         "this machine busy)"),
            Planted("xid", f"XID 48 + 1 uncorrected ECC error at {self.xid_at_s:.0f} s",
                    self.place(self.xid_node, self.xid_gpu), self.xid_at_s, self.xid_at_s,
                    expect=("alert:GpuXidCritical", "alert:GpuEccUncorrectedIncreasing", "action:drain"),
                    lasting={"alert:GpuRowRemapPending": "until an operator resets the GPU"},
                    hint=f"agent alerts GpuXidCritical and GpuEccUncorrectedIncreasing at once, held "
                         f"{self.event_hold_s:g} simulated s; GpuRowRemapPending stays until the GPU is reset; "
                         f"the rules service would drain the node (remediation is dry run by default) and "
                         f"return it 10 s after the XID alert clears"),
        )
