"""XID codes the agent knows: severity, meaning and what the operator should do. Data, not logic.

Sources: NVIDIA's XID documentation (docs.nvidia.com/deploy/xid-errors) for the meanings;
NVIDIA's k8s-device-plugin for the application-caused set it ignores for GPU health
(13, 31, 43, 45, 68). Severities are gpumond's operational judgement: `info` = the GPU is
fine, an application failed; `warning` = drain and reset at the next opportunity;
`critical` = the GPU is unusable or corrupting data until reset or replaced.
docs/xid.md renders this table; a test keeps the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["critical", "warning", "info"]


@dataclass(frozen=True, slots=True)
class XidInfo:
    """What one XID code means for an operator."""

    code: int
    severity: Severity
    meaning: str
    action: str
    application: bool = False  # usually caused by the application, not the GPU


_RESTART_APP = "Usually an application bug: check the job's logs; the GPU stays usable."
_RESET = "Drain the GPU, reset it (nvidia-smi -r) or reboot; open a support case if it recurs."

XID_TABLE: dict[int, XidInfo] = {
    info.code: info
    for info in (
        XidInfo(8, "warning", "GPU stopped processing (channel idle timeout)",
                "Restart the application; if it recurs without an application cause, drain and reset."),
        XidInfo(13, "info", "Graphics engine exception", _RESTART_APP, application=True),
        XidInfo(31, "info", "GPU memory page fault (an illegal address access)", _RESTART_APP,
                application=True),
        XidInfo(32, "warning", "Invalid or corrupted push buffer stream",
                "Check PCIe health (replay counter) and system memory; drain and reset if it recurs."),
        XidInfo(43, "info", "GPU stopped processing: a channel was reset after an application fault",
                _RESTART_APP, application=True),
        XidInfo(45, "info", "Preemptive cleanup after earlier errors (often a killed process)",
                "Look for the XID that came before it; this one only reports the cleanup.",
                application=True),
        XidInfo(48, "critical", "Double-bit (uncorrectable) ECC error",
                "Drain the GPU and reset it so the bad memory is retired or remapped; "
                "replace it if the remap fails (XID 64) or errors recur."),
        XidInfo(61, "warning", "Internal micro-controller breakpoint / warning",
                "Drain and reset the GPU; update the driver if it recurs."),
        XidInfo(62, "critical", "Internal micro-controller halt",
                "The GPU needs a reset: drain it and reset or reboot; open a support case if it recurs."),
        XidInfo(63, "warning", "ECC page retirement or row remapping recorded; pending until reset",
                "Drain the GPU and reset it to activate the remap (nvidia-smi -q -d ROW_REMAPPER)."),
        XidInfo(64, "critical", "ECC page retirement or row remapping failed",
                "The GPU cannot isolate bad memory any more: take it out of service and RMA it."),
        XidInfo(68, "info", "Video processor (NVDEC) exception", _RESTART_APP, application=True),
        XidInfo(69, "warning", "Graphics engine class error",
                "Restart the application; drain and reset if it recurs across jobs."),
        XidInfo(74, "critical", "NVLink error",
                "Collectives over the link fail: drain, reset the GPU, check the link with "
                "nvidia-smi nvlink -e; reseat or replace the part if errors recur."),
        XidInfo(79, "critical", "GPU has fallen off the bus",
                "The GPU is gone until reset: drain the node, check dmesg for PCIe/power events, "
                "reboot; reseat or RMA if it recurs."),
        XidInfo(92, "warning", "High single-bit ECC error rate",
                "Corrected for now, but a predictor of uncorrectable errors: trend it and plan a drain."),
        XidInfo(94, "warning", "Contained ECC error: the affected application was stopped",
                "Other work continues; drain and reset at the next opportunity to remap the row."),
        XidInfo(95, "critical", "Uncontained ECC error: every application on the GPU is affected",
                "Drain the GPU and reset it now; replace it if it recurs."),
        XidInfo(119, "critical", "GSP firmware RPC timeout",
                "The GPU is likely wedged: drain and reset it; update the driver if it recurs."),
        XidInfo(120, "critical", "GSP firmware error",
                "Drain and reset the GPU; update the driver if it recurs."),
    )
}


def xid_info(code: int) -> XidInfo:
    """The table's entry, or a `warning` for a code this table does not know."""
    known = XID_TABLE.get(code)
    if known is not None:
        return known
    return XidInfo(code, "warning", "unknown XID, see nvidia-smi -q and dmesg",
                   "Look the code up in NVIDIA's XID catalogue; check dmesg for the driver's message.")
