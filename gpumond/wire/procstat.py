"""A process's start time as the kernel states it: what the job SDK tells the node relay and the relay compares.

`/proc/<pid>/stat` field 22 (starttime) counts clock ticks since boot: one value per process whatever PID namespace
it is read from, so a rank's (pid in its container, start time) names one host process where its pid alone can name
several (PID 1 in every container, or pod A's pid 25 on a GPU and pod B's pid 25 not yet on one).
"""

from __future__ import annotations

from pathlib import Path

# The comm field (2) is in parentheses and may itself hold spaces and ")": the fields after the last ")" start at 3.
_START_FIELD = 22 - 3


def start_ticks(pid: int | str = "self", proc: Path = Path("/proc")) -> int | None:
    """Clock ticks since boot at which process `pid` (or this process) started; None where /proc does not say."""
    try:
        text = (proc / str(pid) / "stat").read_bytes().decode("ascii", "replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 1:].split()
    if len(fields) <= _START_FIELD or not fields[_START_FIELD].isdecimal():
        return None
    return int(fields[_START_FIELD])
