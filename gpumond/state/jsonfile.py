"""The daemons' state files: one mechanism for every JSON record a daemon keeps across restarts.

A state file is read at start-up, often under systemd's Restart=: whatever its bytes, reading it must never
raise (a traceback there is a crash loop), never stop the daemon from doing its work with what it can trust,
and never lose the evidence. So a read

- takes at most `max_bytes` (a runaway file is not parsed into memory), decodes UTF-8 and parses JSON with the
  recursion a hostile nesting causes caught;
- checks the document is an object of the expected `version`;
- validates every record on its own (`records`): a bad one is left out, named in the log, and the file as read is
  kept under a numbered name (`alerts-state.json.rejected.1`, `.2`, …) for a post-mortem; the good ones are used;
- sets a file it cannot use at all aside under a numbered name (`…corrupt.1`, …) that no later corruption
  overwrites, and starts empty.

A read-only reader (`gpumond remediation list`) reports the same problems and moves or copies nothing.
Writes replace the file atomically (gpumond.state.atomic).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import Field, StrictBool, StrictStr, ValidationError

from gpumond.state.atomic import replace_atomically

log = logging.getLogger("gpumond.state")

T = TypeVar("T")

# Field types for the record models that validate what a file holds: a number is a finite number (not a string,
# not a bool, not NaN), a string a string, a flag a bool. Lists are read as tuples.
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Text = StrictStr
Flag = StrictBool

MAX_BYTES = 64 << 20  # far beyond any real record (a record per node or alert); a bigger file is not parsed


@dataclass(frozen=True, slots=True)
class Document:
    """What a read found: the document (empty when there was none or it could not be used) and its problems."""

    body: Mapping[str, Any] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    @property
    def trusted(self) -> bool:
        """Whether everything the file held was used (False: some state may be missing)."""
        return not self.problems


class JsonStateFile:
    """One versioned JSON document in a daemon's state directory.

    `what` names it in the log ("remediation state"); `consequence` says what an unusable file costs ("nodes
    gpumond drained are adopted again from their scheduler reason"); `sections` are the record maps, whose wrong
    shape makes the whole file unusable. `path` None keeps nothing on disk."""

    def __init__(self, path: Path | None, *, what: str, version: int, consequence: str = "",
                 sections: tuple[str, ...] = (), read_only: bool = False, max_bytes: int = MAX_BYTES,
                 write: Callable[[Path, str], None] = replace_atomically,
                 move: Callable[[Path, Path], None] = os.replace) -> None:
        self.path = path
        self.what = what
        self.version = version
        self.consequence = consequence
        self.sections = sections  # top-level keys that must hold an object when present (the record maps)
        self.read_only = read_only
        self.max_bytes = max_bytes
        self._write = write  # injected so tests can fail it as a full or read-only disk does
        self._move = move

    # ----- reading --------------------------------------------------------------------------------------
    def read(self) -> Document:
        """The document; never raises. A missing file is an empty document without problems."""
        if self.path is None:
            return Document()
        try:
            with open(self.path, "rb") as f:
                raw = f.read(self.max_bytes + 1)
        except FileNotFoundError:
            return Document()
        except OSError as e:  # set aside if it can be (the directory is writable): never overwritten unread
            return self._unusable(f"cannot be read: {e.strerror or e}")
        if len(raw) > self.max_bytes:
            return self._unusable(f"larger than {self.max_bytes} bytes")
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            return self._unusable(f"not UTF-8 text ({e.reason} at byte {e.start})")
        except ValueError as e:
            return self._unusable(f"not JSON ({e})")
        except RecursionError:
            return self._unusable("nested too deeply to be a state file")
        if not isinstance(data, dict):
            return self._unusable(f"a JSON {type(data).__name__}, not an object")
        if data.get("version") != self.version:
            return self._unusable(f"version {_short(data.get('version'))}, this gpumond reads version {self.version}")
        for name in self.sections:
            if name in data and not isinstance(data[name], dict):
                return self._unusable(f"{name}: a JSON {type(data[name]).__name__}, not an object")
        return Document(data)

    def records(self, doc: Document, section: str, parse: Callable[[str, Any], T]) -> tuple[dict[str, T], list[str]]:
        """The valid records of the object `doc.body[section]` (key → value), each through `parse`, which raises
        ValueError, TypeError or pydantic's ValidationError on a bad one; and one line per record left out. The
        caller passes every such line of one read to `reject` at once."""
        raw = doc.body.get(section, {})
        if not isinstance(raw, dict):
            return {}, [f"{section}: a JSON {type(raw).__name__}, not an object"]
        out: dict[str, T] = {}
        bad: list[str] = []
        for key, value in raw.items():
            try:
                out[key] = parse(key, value)
            except ValidationError as e:
                err = e.errors()[0]
                where = ".".join(str(x) for x in err["loc"])
                bad.append(f"{section}[{_short(key)}]{'.' + where if where else ''}: {err['msg']}")
            except (ValueError, TypeError, KeyError, AttributeError) as e:
                bad.append(f"{section}[{_short(key)}]: {e}")
        return out, bad

    def reject(self, problems: list[str] | tuple[str, ...]) -> None:
        """Report the records a read left out, and keep the file as read under a numbered name (not read-only)."""
        if not problems:
            return
        copy = None if self.read_only else self._keep(".rejected", move=False)
        extra: dict[str, Any] = {"path": str(self.path), "records": len(problems), "errors": "; ".join(problems[:5])}
        if copy is not None:
            extra["copy"] = str(copy)
        log.error(f"{self.what} file: invalid record(s) left out, the rest used", extra=extra)

    def _unusable(self, why: str, *, set_aside: bool = True) -> Document:
        aside = self._keep(".corrupt", move=True) if set_aside and not self.read_only else None
        extra = {"path": str(self.path), "error": why}
        if aside is not None:
            extra["moved_to"] = str(aside)
        log.error(f"{self.what} file unusable{'; set aside' if aside else ''}"
                  f"{': ' + self.consequence if self.consequence else ''}", extra=extra)
        return Document(problems=(f"{self.path}: {why}",))

    def _keep(self, suffix: str, *, move: bool) -> Path | None:
        """Move (or copy) the file to `<name><suffix>.<n>` with the first free n; None when that failed."""
        assert self.path is not None
        n = 1
        while (aside := self.path.with_name(f"{self.path.name}{suffix}.{n}")).exists():
            n += 1
        try:
            if move:
                self._move(self.path, aside)
            else:
                shutil.copyfile(self.path, aside)
        except OSError as e:
            log.error(f"cannot keep the {self.what} file for a post-mortem",
                      extra={"path": str(self.path), "to": str(aside), "error": e.strerror or str(e)})
            return None
        return aside

    # ----- writing --------------------------------------------------------------------------------------
    def write(self, body: Mapping[str, Any]) -> None:
        """Replace the file atomically with `body` and this file's version. Raises OSError when it could not be
        written (full or read-only disk): the caller decides what that costs."""
        if self.path is None:
            return
        if self.read_only:
            raise PermissionError(f"{self.path}: opened read-only")
        self._write(self.path, json.dumps({"version": self.version, **body}, indent=1, sort_keys=True,
                                          allow_nan=False))


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"
