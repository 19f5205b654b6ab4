"""Slurm: read nodes with `sinfo`, drain and resume with `scontrol update` (SLURM_CONF selects the cluster)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence

from gpumond.config.remediation import SlurmConfig
from gpumond.rules.remediation.backends.base import BackendError, NotOurs
from gpumond.rules.remediation.faults import REASON_PREFIX
from gpumond.rules.remediation.plan import NodeStatus

_SEP = "\x1f"  # a reason may hold any printable character; the unit separator it cannot
# %N node, %P partition ("*" marks the default), %T long state (drained, draining, down*, idle…), %E reason.
_FORMAT = _SEP.join(("%N", "%P", "%T", "%E"))
_OUT_OF_SERVICE = ("drain", "down", "fail", "maint")

Runner = Callable[[Sequence[str], float], subprocess.CompletedProcess[str]]


def _run(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)


def parse_sinfo(text: str) -> dict[str, NodeStatus]:
    """`sinfo -N -h -o FORMAT` output → status by node (a node in several partitions: its first)."""
    out: dict[str, NodeStatus] = {}
    for line in text.splitlines():
        fields = line.split(_SEP)
        if len(fields) != 4 or not fields[0]:
            continue
        node, partition, state, reason = fields
        reason = "" if reason == "none" else reason
        if node not in out:
            out[node] = NodeStatus(node=node, pool=partition.rstrip("*"),
                                   drained=any(s in state.lower() for s in _OUT_OF_SERVICE),
                                   ours=reason.startswith(REASON_PREFIX), reason=reason)
    return out


class SlurmBackend:
    """Drains with `scontrol update NodeName=N State=DRAIN Reason="gpumond: …"`; resumes only nodes whose
    reason gpumond wrote, checked again just before the resume."""

    name = "slurm"

    def __init__(self, cfg: SlurmConfig, run: Runner = _run) -> None:
        self._cfg = cfg
        self._run = run

    def nodes(self) -> Mapping[str, NodeStatus]:
        return parse_sinfo(self._call([self._cfg.sinfo, "--Node", "--noheader", "--format", _FORMAT], "sinfo"))

    def _node(self, node: str) -> NodeStatus | None:
        text = self._call([self._cfg.sinfo, "--Node", "--noheader", "--nodes", node, "--format", _FORMAT], "sinfo")
        return parse_sinfo(text).get(node)

    def drain(self, node: str, reason: str, fatal: bool) -> None:
        st = self._node(node)
        if st is None:
            raise BackendError(f"slurm: node {node} is not in the cluster (sinfo does not list it)")
        if st.drained and not st.ours:
            raise NotOurs(f"slurm: node {node} is already out of service ({st.reason or 'no reason'}); not touched")
        self._call([self._cfg.scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"], "scontrol")

    def resume(self, node: str) -> None:
        st = self._node(node)
        if st is None:
            raise BackendError(f"slurm: node {node} is not in the cluster (sinfo does not list it)")
        if not st.ours:
            raise NotOurs(f"slurm: node {node} is not drained by gpumond now ({st.reason or st.drained}); "
                          f"not resumed")
        self._call([self._cfg.scontrol, "update", f"NodeName={node}", "State=RESUME"], "scontrol")

    def _call(self, argv: list[str], what: str) -> str:
        try:
            done = self._run(argv, self._cfg.timeout_s)
        except FileNotFoundError:
            raise BackendError(f"slurm: {argv[0]} not found (install slurm-client, or set remediation.slurm.{what})"
                               ) from None
        except subprocess.TimeoutExpired:
            raise BackendError(f"slurm: {' '.join(argv[:3])} timed out after {self._cfg.timeout_s:g} s "
                               f"(is slurmctld up?)") from None
        if done.returncode != 0:
            err = (done.stderr or done.stdout).strip().splitlines()
            raise BackendError(f"slurm: {' '.join(argv[:3])} failed (exit {done.returncode}): "
                               f"{err[-1] if err else 'no output'}")
        return done.stdout
