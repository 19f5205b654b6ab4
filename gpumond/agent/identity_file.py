"""The GPUs this node had, by index, kept in the state directory (`gpus.json`).

A GPU already off the bus when the agent starts cannot be asked its UUID. Without this record it would come
back nameless, and its alerts, whose labels carry the UUID, would look like new alerts: the open page
resolved and a second one sent for the same lost GPU. The record is only a name to start from: the session
reads the GPU afresh, by index, when it answers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from gpumond.state.jsonfile import JsonStateFile
from gpumond.nvml.session import GpuIdentity

log = logging.getLogger("gpumond.agent")

FILE_NAME = "gpus.json"
_VERSION = 1


class IdentityFile:
    """Loads the last run's GPU identities and saves this run's when they change (`path` None: neither)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file = JsonStateFile(path, what="gpu identity", version=_VERSION,
                                   consequence="GPUs lost at start stay nameless until they answer")
        self._saved: tuple[GpuIdentity, ...] | None = None
        self._failing = False

    def load(self) -> dict[int, GpuIdentity]:
        """Index → identity from the last run; empty when there is none or it cannot be read (said once, the
        file kept aside by gpumond.state.jsonfile); a bad entry is left out and the others used."""
        doc = self._file.read()
        gpus = doc.body.get("gpus", [])
        if not isinstance(gpus, list):
            self._file.reject(["gpus: not a list"])
            return {}
        out: dict[int, GpuIdentity] = {}
        problems = []
        for n, g in enumerate(gpus):
            try:
                ident = GpuIdentity(int(g["index"]), str(g["uuid"]), str(g["name"]), str(g["pci_bus_id"]),
                                    None if g.get("minor") is None else int(g["minor"]))
            except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as e:
                problems.append(f"gpus[{n}]: {e!r}"[:200])
                continue
            out[ident.index] = ident
        self._file.reject(problems)
        return out

    def save(self, identities: Iterable[GpuIdentity]) -> None:
        """Record the GPUs read in this run (nameless ones are left out); a write only when they changed."""
        if self.path is None:
            return
        known = tuple(sorted((i for i in identities if i.uuid), key=lambda i: i.index))
        if known == self._saved or not known:
            return
        doc = {"gpus": [{"index": i.index, "uuid": i.uuid, "name": i.name,
                                              "pci_bus_id": i.pci_bus_id, "minor": i.minor} for i in known]}
        try:
            self._file.write({"gpus": doc["gpus"]})
        except OSError as e:
            if not self._failing:  # retried at every change; said once until it works again
                log.warning("cannot record gpu identities", extra={"path": str(self.path),
                                                                   "error": e.strerror or str(e)})
            self._failing = True
            return
        self._failing = False
        self._saved = known
