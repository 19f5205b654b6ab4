"""What the demo plants, and when: one place to read the story the demo tells."""

from __future__ import annotations

from dataclasses import dataclass

JOB = "demo-llama-8b"
GPUS_PER_NODE = 8


@dataclass(frozen=True, slots=True)
class DemoPlan:
    """The demo cluster and its faults (times in seconds of simulated time since start)."""

    nodes: int = 4
    hot_node: int = 1  # this node's GPU `hot_gpu` loses cooling: thermal policy caps it, the job straggles
    hot_gpu: int = 3
    hot_at_s: float = 10.0
    starved_node: int = 2  # this rank's data loader starves (slow local disk)
    starved_gpu: int = 5
    starved_at_s: float = 25.0
    starved_wait_frac: float = 0.35
    xid_node: int = 0  # an XID 48 (double-bit ECC) with uncorrected errors: agent alerts
    xid_gpu: int = 6
    xid_at_s: float = 40.0
    step_s: float = 0.25  # one training step's compute time at full clock

    def node_name(self, i: int) -> str:
        """Node names as the agents and the job report them."""
        return f"demo-node-{i:02d}"

    def scenario(self, node: int) -> dict[str, object]:
        """The simulator scenario for one node's agent."""
        faults: list[dict[str, object]] = []
        if node == self.hot_node:
            faults.append({"gpu": self.hot_gpu, "kind": "cooling", "factor": 1.9, "at_s": self.hot_at_s})
        if node == self.xid_node:
            faults += [{"gpu": self.xid_gpu, "kind": "xid", "code": 48, "at_s": self.xid_at_s},
                       {"gpu": self.xid_gpu, "kind": "ecc_uncorrected", "count": 1, "at_s": self.xid_at_s}]
        return {"default_load": {"pattern": "constant", "utilization": 0.97}, "faults": faults}

    def rank_of(self, node: int, gpu: int) -> int:
        """The job's rank on (node, gpu): ranks fill nodes in order."""
        return node * GPUS_PER_NODE + gpu
