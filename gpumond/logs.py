"""Structured logs for the daemons: logfmt or JSON lines, fields passed via `extra=`."""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any, TextIO

from gpumond.safetext import escape_unsafe

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("logfmt", "json")

# Everything a bare LogRecord carries; anything else on a record came from `extra=`.
_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",  # added to LogRecord in Python 3.12
}
# Keys every line starts with; an `extra` field of the same name gets a trailing "_".
_HEAD = ("ts", "level", "logger", "msg")


def setup_logging(level: str = "info", fmt: str = "logfmt", stream: TextIO | None = None) -> None:
    """Send the `gpumond` logger tree to `stream` (default stderr) as logfmt or JSON lines."""
    level, fmt = level.lower(), fmt.lower()
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)} (got {level!r})")
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)} (got {fmt!r})")
    logger = logging.getLogger("gpumond")
    for old in [h for h in logger.handlers if getattr(h, "_gpumond", False)]:
        logger.removeHandler(old)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    handler._gpumond = True  # type: ignore[attr-defined]  # marks ours for idempotent re-setup
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    # Records still propagate: the root logger has no handler in a daemon, and test
    # harnesses (pytest's caplog) capture from there.


def record_fields(record: logging.LogRecord, formatter: logging.Formatter) -> dict[str, Any]:
    """The ordered fields of one log line: head, then `extra=` fields, then exception."""
    fields: dict[str, Any] = {
        "ts": _timestamp(record.created),
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    for key, value in record.__dict__.items():
        if key not in _STANDARD_ATTRS:
            fields[f"{key}_" if key in _HEAD else key] = value
    if record.exc_info:
        # Cached like logging.Formatter does, so several handlers format it once.
        record.exc_text = record.exc_text or formatter.formatException(record.exc_info)
    if record.exc_text:
        fields["exc"] = record.exc_text
    if record.stack_info:
        fields["stack"] = formatter.formatStack(record.stack_info)
    return fields


class LogfmtFormatter(logging.Formatter):
    """`key=value` pairs on one line; values with spaces, quotes, `=` or controls are quoted."""

    def format(self, record: logging.LogRecord) -> str:
        fields = record_fields(record, self)
        # Quoted values are JSON-escaped, which leaves C1 controls, U+2028/9 and bidi controls raw: escape
        # those too, so no value (a job name from a push, an exception text) can split or reorder the line.
        return escape_unsafe(" ".join(f"{_key(k)}={_logfmt_value(v)}" for k, v in fields.items()))


class JsonFormatter(logging.Formatter):
    """One JSON object per line; values JSON cannot encode are written as their str()."""

    def format(self, record: logging.LogRecord) -> str:
        # Unsafe characters only occur inside JSON strings here, where \uXXXX means the same character.
        return escape_unsafe(json.dumps(record_fields(record, self), default=str, ensure_ascii=False))


def _timestamp(created: float) -> str:
    moment = datetime.fromtimestamp(created, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _key(key: str) -> str:
    # A key cannot be quoted in logfmt, so characters that would split it become "_".
    cleaned = "".join("_" if c.isspace() or c in '="' or not c.isprintable() else c for c in key)
    return cleaned or "_"


def _logfmt_value(value: Any) -> str:
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    else:
        text = str(value)
    if text and not any(c.isspace() or c in '"=\\' or not c.isprintable() for c in text):
        return text
    # JSON string escaping is exactly logfmt's: \" \\ \n \t and \uXXXX for controls.
    return json.dumps(text, ensure_ascii=False)
