"""Structured logs for the daemons: logfmt or JSON lines, fields passed via `extra=`, floods rate-limited.

Every line a daemon writes goes through here: gpumond's own loggers, and (on a second handler at the root
logger) the libraries', uvicorn's "Invalid HTTP request received." and asyncio's exception reports above
all, which would otherwise reach stderr raw and multi-line through logging's last-resort handler.
"""

from __future__ import annotations

import atexit
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, TextIO

from gpumond.wire.safetext import escape_unsafe

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("logfmt", "json")

# Everything a bare LogRecord carries; anything else on a record came from `extra=`.
_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",  # added to LogRecord in Python 3.12
    "_gpumond_summary",
    "color_message",  # uvicorn's copy of msg with terminal colour codes
}
# Keys every line starts with; an `extra` field of the same name gets a trailing "_".
_HEAD = ("ts", "level", "logger", "msg")
# Repeated events: at most BURST lines per call site per WINDOW_S; the rest are counted, and the count is
# written on the site's next line (`suppressed=N`) or, if the site falls silent, on a summary line.
# A gpumond line naming a GPU (`gpu=`, else `uuid=`) has its own budget per GPU: "gpu lost" for 16 GPUs at
# once is 16 distinct events an operator must see, each GPU's repeats are still cut, and the number of keys
# stays bounded by sites x GPUs on the node (the values come from NVML, never from a client). Foreign
# records (libraries, uvicorn) are keyed by call site only, so a flood from them stays cut to one burst.
BURST = 10
WINDOW_S = 60.0
# Libraries log through the root logger; below WARNING they are noise for an operator.
_FOREIGN_LEVEL = logging.WARNING


def setup_logging(level: str = "info", fmt: str = "logfmt", stream: TextIO | None = None) -> None:
    """Send the `gpumond` logger tree to `stream` (default stderr) as logfmt or JSON lines."""
    level, fmt = level.lower(), fmt.lower()
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)} (got {level!r})")
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)} (got {fmt!r})")
    logger, root = logging.getLogger("gpumond"), logging.getLogger()
    for where in (logger, root):
        for old in [h for h in where.handlers if getattr(h, "_gpumond", False)]:
            where.removeHandler(old)
            for f in old.filters:
                if isinstance(f, RateLimit) and where is logger:
                    f.flush()  # what a previous setup still held back is not lost
    out = stream if stream is not None else sys.stderr
    formatter = JsonFormatter() if fmt == "json" else LogfmtFormatter()
    limit = RateLimit()  # one budget per call site, whichever handler the record reaches
    own = _handler(out, formatter, limit)
    logger.addHandler(own)
    logger.setLevel(level.upper())
    # Records still propagate: test harnesses (pytest's caplog) capture from the root logger. The root's
    # handler below writes only records from outside the gpumond tree, so nothing is written twice.
    foreign = _handler(out, formatter, limit, foreign_only=True)
    # A level above WARNING holds for libraries too: `error` (the demo's, or an operator's) must not let
    # apscheduler's "skipped: maximum number of running instances" warnings through.
    foreign.setLevel(max(_FOREIGN_LEVEL, logging.getLevelName(level.upper())))
    root.addHandler(foreign)
    if root.level > _FOREIGN_LEVEL or root.level == logging.NOTSET:
        root.setLevel(_FOREIGN_LEVEL)
    limit.emit = own.handle  # summary lines of suppressed events go out like any gpumond line
    _capture_stray_output(limit)


_LIMITS: list[RateLimit] = []  # the live limiter, flushed at exit so no count of suppressed lines is lost


def log_limited(logger: logging.Logger, level: int, msg: str, extra: dict[str, Any] | None = None) -> None:
    """`logger.log(level, msg, extra=extra)` from a call site that floods by design, where a line held back by the
    rate limit is not even built. A server past its connection cap closes one connection per new one and logs
    each: a held-back record still costs ~13 µs to make and filter (LogRecord, findCaller, the limit; ~40 µs in
    the daemon's profile, benchmarks/results/push_cost_profile.md), asking the limit first ~3-4 µs. The same
    budget, `suppressed=N` and summary lines as logger.log() (the same key: logger, file, line, GPU); a record
    is always made when some handler it would reach has no rate limit (pytest's caplog, say)."""
    if not logger.isEnabledFor(level):
        return
    limit = _only_limit(logger, level)
    if limit is not None:
        caller = sys._getframe(1)
        gpu = _gpu_key(logger.name, extra.get("gpu"), extra.get("uuid")) if extra else None
        if limit.held_back((logger.name, caller.f_code.co_filename, caller.f_lineno, gpu), level, msg):
            return
    logger.log(level, msg, extra=extra, stacklevel=2)  # stacklevel: the record names our caller's line


def _only_limit(logger: logging.Logger, level: int) -> RateLimit | None:
    """The one RateLimit that every handler a record of `logger` at `level` reaches filters it with; None when
    one of them has none, or they have different ones (then only the record itself can be judged)."""
    found = None
    node: logging.Logger | None = logger
    while node is not None:
        for handler in node.handlers:
            if level < handler.level:
                continue
            for limit in handler.filters:
                if isinstance(limit, RateLimit):
                    break
            else:
                return None  # this handler writes every record it gets
            if found is not None and limit is not found:
                return None
            found = limit
        node = node.parent if node.propagate else None
    return found


def _capture_stray_output(limit: RateLimit) -> None:
    """Route what Python would print raw to stderr through logging: warnings, thread and unraisable errors."""
    logging.captureWarnings(True)  # warnings.warn -> the "py.warnings" logger, one line each
    stray = logging.getLogger("gpumond.stray")

    def thread_error(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        stray.error("unhandled exception in a thread", exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
                    extra={"thread_name": args.thread.name if args.thread else None})

    def unraisable(args: sys.UnraisableHookArgs) -> None:  # type: ignore[name-defined]
        exc = (args.exc_type, args.exc_value, args.exc_traceback) if args.exc_value is not None else None
        stray.error("unraisable exception", exc_info=exc, extra={"where": repr(args.object)[:200],
                                                               "detail": args.err_msg})

    threading.excepthook = thread_error
    sys.unraisablehook = unraisable
    if not _LIMITS:
        atexit.register(lambda: [lim.flush() for lim in _LIMITS])
    _LIMITS[:] = [limit]


def _handler(stream: TextIO, formatter: logging.Formatter, limit: RateLimit,
             foreign_only: bool = False) -> logging.Handler:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    if foreign_only:  # before the limit, so a gpumond record is counted once, by its own handler
        handler.addFilter(lambda r: not (r.name == "gpumond" or r.name.startswith("gpumond.")))
    handler.addFilter(limit)
    handler._gpumond = True  # type: ignore[attr-defined]  # marks ours for idempotent re-setup
    return handler


class RateLimit(logging.Filter):
    """At most `burst` records per call site (per GPU on gpumond lines naming one) per `window_s`; counts the rest."""

    def __init__(self, burst: int = BURST, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._burst, self._window, self._clock = burst, window_s, clock
        self._lock = threading.Lock()
        # (call site, GPU) -> [window start, lines let through in it, suppressed since the last line, a sample]
        self._sites: dict[tuple[str, str, int, Any], list] = {}
        self._next_sweep = 0.0
        self.emit: Callable[[logging.LogRecord], object] | None = None
        self.suppressed_total = 0

    def filter(self, record: logging.LogRecord) -> bool:
        """True to write the record (with `suppressed=N` when lines of its site were held back)."""
        if getattr(record, "_gpumond_summary", False):
            return True
        now = self._clock()
        gpu = _gpu_of(record)
        site = (record.name, record.pathname, record.lineno, gpu)
        with self._lock:
            state = self._sites.get(site)
            if state is None:
                if len(self._sites) >= 10_000:  # bounded: a flood of distinct sites must not grow memory
                    self._sites.clear()
                state = self._sites[site] = [now, 0, 0, None]
            if now - state[0] >= self._window:
                state[0], state[1] = now, 0
            if state[1] >= self._burst:
                self._hold(state, record.name, record.levelno, record.getMessage(), gpu)
                return False
            state[1] += 1
            if state[2]:
                record.suppressed = state[2]
                state[2] = 0
            due = self._sweep_due(now)
        if due:
            self._summarise(due)
        return True

    def held_back(self, site: tuple[str, str, int, Any], levelno: int, message: str) -> bool:
        """Whether filter() would hold back the next record of `site` (logger, file, line, GPU) now; if so it is
        counted as held back here, as filter() would, and need not be made (log_limited)."""
        now = self._clock()
        with self._lock:
            state = self._sites.get(site)
            if state is None or now - state[0] >= self._window or state[1] < self._burst:
                return False  # filter() lets it through, and counts it against the budget
            self._hold(state, site[0], levelno, message, site[3])
            return True

    def _hold(self, state: list, logger: str, levelno: int, message: str, gpu: Any) -> None:
        """Count one line of a site held back, keeping it as the site's sample (called under the lock)."""
        state[2] += 1
        state[3] = (logger, levelno, message[:200], gpu)
        self.suppressed_total += 1

    def _sweep_due(self, now: float) -> list[tuple[tuple[str, int, str, Any], int]]:
        """Sites whose window ended with lines held back and nothing since (called under the lock)."""
        if now < self._next_sweep:
            return []
        self._next_sweep = now + 1.0
        due = []
        for state in self._sites.values():
            if state[2] and now - state[0] >= self._window:
                due.append((state[3], state[2]))
                state[0], state[1], state[2] = now, 0, 0
        return due

    def flush(self) -> None:
        """Report every count still held back (at shutdown, or when logging is set up again)."""
        with self._lock:
            due = [(s[3], s[2]) for s in self._sites.values() if s[2]]
            for s in self._sites.values():
                s[2] = 0
        self._summarise(due)

    def _summarise(self, due: list[tuple[tuple[str, int, str, Any], int]]) -> None:
        for (name, levelno, message, gpu), count in due:
            record = logging.LogRecord("gpumond.logs", levelno, __file__, 0, "repeated log lines suppressed",
                                       (), None)
            record.suppressed, record.of_logger, record.of_msg = count, name, message
            if gpu is not None:
                record.of_gpu = gpu  # which GPU's repeats were held back
            record._gpumond_summary = True
            if self.emit is not None:
                self.emit(record)


def _gpu_of(record: logging.LogRecord) -> Any:
    """The GPU a gpumond record names (its `gpu`, else `uuid` field), which gets its own budget; else None."""
    return _gpu_key(record.name, getattr(record, "gpu", None), getattr(record, "uuid", None))


def _gpu_key(logger: str, gpu: Any, uuid: Any) -> Any:
    if not (logger == "gpumond" or logger.startswith("gpumond.")):
        return None
    if gpu is None:
        gpu = uuid
    # Only plain values key a budget: an unhashable or long one is treated as naming no GPU.
    return gpu if isinstance(gpu, int) or (isinstance(gpu, str) and len(gpu) <= 64) else None


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
