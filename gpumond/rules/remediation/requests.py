"""Operator requests to the running rules service, as files in its state directory.

`gpumond remediation undo NODE` and `… reset-breaker` write one small file each under
`<state_dir>/remediation-requests/`; the service carries it out at its next remediation step and deletes it.
File permissions are the authorisation (whoever may write the service's state may ask), and a request
survives a restart of either side.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from gpumond.state.atomic import replace_atomically

DIR_NAME = "remediation-requests"
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True, slots=True)
class Requests:
    """What operators asked for since the last step, and the files to delete once it is carried out."""

    undo: tuple[str, ...] = ()
    reset_breaker: bool = False
    files: tuple[Path, ...] = ()


def request_dir(state_dir: Path) -> Path:
    return state_dir / DIR_NAME


def write_undo(state_dir: Path, node: str, by: str) -> Path:
    """Ask the service to return `node` to service now and leave it alone until its faults clear."""
    path = request_dir(state_dir) / f"undo-{_SAFE.sub('_', node)}.json"
    replace_atomically(path, json.dumps({"action": "undo", "node": node, "by": by}))
    return path


def write_reset_breaker(state_dir: Path, by: str) -> Path:
    """Ask the service to close its circuit breaker."""
    path = request_dir(state_dir) / "reset-breaker.json"
    replace_atomically(path, json.dumps({"action": "reset_breaker", "by": by}))
    return path


def read_requests(state_dir: Path) -> tuple[Requests, list[str]]:
    """Pending requests, and one line per request file that could not be read (it is then deleted)."""
    folder = request_dir(state_dir)
    undo: list[str] = []
    reset = False
    files: list[Path] = []
    problems: list[str] = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        files.append(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            action = data["action"]
            if action == "undo" and isinstance(data.get("node"), str) and data["node"]:
                undo.append(data["node"])
            elif action == "reset_breaker":
                reset = True
            else:
                raise ValueError(f"unknown action {action!r}")
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
            problems.append(f"{path}: unreadable request ({type(e).__name__}: {str(e)[:200]}); deleted")
    return Requests(tuple(dict.fromkeys(undo)), reset, tuple(files)), problems
