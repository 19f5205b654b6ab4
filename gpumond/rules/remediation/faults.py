"""Which confirmed conditions are node faults: agent alerts and rules findings in, NodeFault out. Pure.

A node fault is something that makes every job placed on the node fail or run at the speed of its worst GPU.
A starved job is not one (its data pipeline is slow wherever it runs), nor a lone straggler rank (one job's
view of one GPU), nor a throttling GPU (the agent's own thermal policy handles it on the node).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpumond.rules.types import AgentAlert, Finding

LOST_XID = "79"  # "GPU has fallen off the bus"


@dataclass(frozen=True, slots=True)
class NodeFault:
    """One reason to take a node out of service."""

    node: str
    condition: str  # gpu_lost | xid_critical | row_remap_failed | straggler_node
    detail: str  # what a person reads in the scheduler's reason: "GPU 3 lost (XID 79)"
    fatal: bool  # a GPU is unusable until reset (Kubernetes: may also taint NoExecute)
    source: str  # the alert behind it, e.g. "GpuXidCritical"


def agent_faults(alerts: Iterable[AgentAlert]) -> list[NodeFault]:
    """Node faults from what agents have firing: a lost GPU, an XID whose documented action is a reset or
    reboot (the agent's XID table marks those critical), a failed row remap. The agent's lifecycle already
    confirmed each (GpuLost holds for 15 s; XIDs are events)."""
    out: dict[tuple[str, str, str], NodeFault] = {}
    for a in alerts:
        name, gpu = a.label("alertname"), a.label("gpu") or "?"
        fault: NodeFault | None = None
        if name == "GpuLost":
            fault = NodeFault(a.node, "gpu_lost", f"GPU {gpu} lost", True, name)
        elif name == "GpuXidCritical" and a.label("xid") == LOST_XID:
            fault = NodeFault(a.node, "gpu_lost", f"GPU {gpu} lost (XID 79)", True, name)
        elif name == "GpuXidCritical" and a.label("severity") == "critical":
            fault = NodeFault(a.node, "xid_critical", f"GPU {gpu} XID {a.label('xid') or '?'}", True, name)
        elif name == "GpuRowRemapFailed":
            fault = NodeFault(a.node, "row_remap_failed", f"GPU {gpu} row remap failed", True, name)
        if fault is not None:
            # One line per GPU and condition: a lost GPU raises both GpuLost and XID 79; keep the one that says more.
            key = (fault.node, fault.condition, gpu)
            if key not in out or len(fault.detail) > len(out[key].detail):
                out[key] = fault
    return list(out.values())


def unreadable_gpus(down: Mapping[str, Iterable[str]], held: Iterable[str],
                    known: Iterable[NodeFault] = ()) -> list[NodeFault]:
    """A node gpumond holds is not clear while its agent cannot read one of its GPUs (gpumond_gpu_up 0), even
    once the XID that drained it expired. Only for held nodes: one failed read is no reason to drain
    (the agent's GpuLost alert waits 15 s for that)."""
    held = set(held)
    lost = {(f.node, f.detail.split()[1]) for f in known if f.condition == "gpu_lost"}  # "GPU 3 lost …"
    return [NodeFault(node, "gpu_lost", f"GPU {gpu} not readable", True, "gpumond_gpu_up")
            for node, gpus in sorted(down.items()) if node in held for gpu in gpus if (node, gpu) not in lost]


def straggler_faults(findings: Iterable[Finding], since: Mapping[str, float], now: float,
                     for_s: float) -> tuple[list[NodeFault], dict[str, float]]:
    """Nodes with a firing straggler_node finding, once it has persisted `for_s` (in any of the node's jobs).

    `since` is when each node was first seen flagged (from the last call); returns the faults and the new map,
    which forgets a node the moment no finding names it.
    """
    flagged: dict[str, list[str]] = {}
    for f in findings:
        if f.kind == "straggler_node" and f.state == "firing" and f.node:
            flagged.setdefault(f.node, []).append(f.job)
    new_since = {node: since.get(node, now) for node in flagged}
    faults = [NodeFault(node, "straggler_node",
                        f"straggler node in job {', '.join(sorted(jobs))} for over {for_s:g} s",
                        False, "TrainingStragglerNode")
              for node, jobs in sorted(flagged.items()) if now - new_since[node] >= for_s]
    return faults, new_since


def by_node(faults: Iterable[NodeFault], enabled: Iterable[str]) -> dict[str, tuple[NodeFault, ...]]:
    """The enabled faults grouped by node, in a stable order."""
    wanted = set(enabled)
    out: dict[str, list[NodeFault]] = {}
    for f in faults:
        if f.condition in wanted:
            out.setdefault(f.node, []).append(f)
    return {n: tuple(sorted(fs, key=lambda f: (f.condition, f.detail))) for n, fs in sorted(out.items())}


REASON_PREFIX = "gpumond: "
MAX_REASON = 200  # Slurm keeps any length; a reason is read in `sinfo -R`, so keep it to a line


def reason_of(faults: Iterable[NodeFault]) -> str:
    """The scheduler reason: `gpumond: GPU 3 lost (XID 79); GPU 1 row remap failed`."""
    text = REASON_PREFIX + "; ".join(dict.fromkeys(f.detail for f in faults))
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 1] + "…"
