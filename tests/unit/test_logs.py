"""Structured log lines: logfmt and JSON, fields from extra=, escaping, exceptions."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpumond.logs import JsonFormatter, LogfmtFormatter, setup_logging
from tests.fakes import FakeClock

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture(autouse=True)
def restore_gpumond_logger():
    logger, root = logging.getLogger("gpumond"), logging.getLogger()
    saved = (logger.handlers[:], logger.level, logger.propagate, root.handlers[:], root.level)
    hooks = (threading.excepthook, sys.unraisablehook)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]
    root.handlers[:], root.level = saved[3], saved[4]
    threading.excepthook, sys.unraisablehook = hooks
    logging.captureWarnings(False)


def emit(fmt: str, level: str = "info") -> tuple[io.StringIO, logging.Logger]:
    stream = io.StringIO()
    setup_logging(level, fmt, stream)
    return stream, logging.getLogger("gpumond.agent")


def parse_logfmt(line: str) -> dict[str, str]:
    """A strict reader for the subset we write: bare values, or JSON-escaped quoted ones."""
    out, pos = {}, 0
    pattern = re.compile(r'([^\s="]+)=("(?:[^"\\]|\\.)*"|[^\s"]*)(?: |$)')
    while pos < len(line):
        match = pattern.match(line, pos)
        assert match, f"unparseable at {pos}: {line[pos:]!r}"
        key, raw = match.groups()
        out[key] = json.loads(raw) if raw.startswith('"') else raw
        pos = match.end()
    return out


def test_logfmt_line_shape() -> None:
    stream, log = emit("logfmt")
    log.warning("gpu lost", extra={"gpu": 3, "uuid": "GPU-5b0c"})
    line = stream.getvalue()
    assert line.endswith("\n") and line.count("\n") == 1
    ts, rest = line.rstrip("\n").split(" ", 1)
    assert TS.match(ts.removeprefix("ts="))
    assert rest == 'level=warning logger=gpumond.agent msg="gpu lost" gpu=3 uuid=GPU-5b0c'


def test_timestamp_is_utc_with_milliseconds() -> None:
    record = logging.LogRecord("gpumond.x", logging.INFO, __file__, 1, "m", (), None)
    record.created = 1795337949.1239  # 2026-11-22T08:59:09.123Z
    assert LogfmtFormatter().format(record).startswith("ts=2026-11-22T08:59:09.123Z ")


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        ("plain", "plain"),
        ("two words", '"two words"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("a=b", '"a=b"'),
        ("line1\nline2", '"line1\\nline2"'),
        ("tab\there", '"tab\\there"'),
        ("back\\slash", '"back\\\\slash"'),
        ("bell\x07", '"bell\\u0007"'),
        ("", '""'),
        ("µs-ünïcode", "µs-ünïcode"),
        (None, "null"),
        (True, "true"),
        (False, "false"),
        (2.5, "2.5"),
        (17, "17"),
    ],
)
def test_logfmt_value_escaping(value: object, rendered: str) -> None:
    stream, log = emit("logfmt")
    log.info("m", extra={"v": value})
    assert stream.getvalue().rstrip("\n").endswith(f" v={rendered}")


def test_logfmt_keys_cannot_break_the_line() -> None:
    stream, log = emit("logfmt")
    log.info("m", extra={"bad key=x": 1})
    assert stream.getvalue().rstrip("\n").endswith(" bad_key_x=1")


@given(st.text(), st.text())
def test_logfmt_round_trips_any_text(msg: str, value: str) -> None:
    record = logging.LogRecord("gpumond.x", logging.INFO, __file__, 1, msg, (), None)
    record.field = value
    line = LogfmtFormatter().format(record)
    assert "\n" not in line
    parsed = parse_logfmt(line)
    assert (parsed["msg"], parsed["field"]) == (msg, value)


def test_logfmt_exception_is_one_escaped_field() -> None:
    stream, log = emit("logfmt")
    try:
        raise RuntimeError("nvml went away")
    except RuntimeError:
        log.exception("sample failed", extra={"gpu": 0})
    line = stream.getvalue()
    assert line.count("\n") == 1
    fields = parse_logfmt(line.rstrip("\n"))
    assert fields["level"] == "error" and fields["gpu"] == "0"
    assert fields["exc"].startswith("Traceback (most recent call last):\n")
    assert fields["exc"].endswith("RuntimeError: nvml went away")


def test_message_arguments_are_interpolated() -> None:
    stream, log = emit("logfmt")
    log.info("gpu %d at %s C", 2, 91)
    assert 'msg="gpu 2 at 91 C"' in stream.getvalue()


def test_only_extra_attributes_become_fields() -> None:
    stream, log = emit("json")
    log.info("m")
    assert set(json.loads(stream.getvalue())) == {"ts", "level", "logger", "msg"}


def test_extra_fields_do_not_overwrite_the_head() -> None:
    stream, log = emit("json")
    log.info("m", extra={"level": "fake", "ts": 0, "logger": "x"})
    obj = json.loads(stream.getvalue())
    assert obj["level"] == "info" and obj["level_"] == "fake"
    assert obj["ts_"] == 0 and obj["logger_"] == "x"


def test_json_line_shape_and_types() -> None:
    stream, log = emit("json")
    log.warning('gpu "lost"\nnow', extra={"gpu": 3, "ok": False, "ratio": 0.5, "none": None, "obj": object()})
    line = stream.getvalue()
    assert line.count("\n") == 1
    obj = json.loads(line)
    assert list(obj)[:4] == ["ts", "level", "logger", "msg"]
    assert TS.match(obj["ts"])
    assert obj["msg"] == 'gpu "lost"\nnow'
    assert (obj["gpu"], obj["ok"], obj["ratio"], obj["none"]) == (3, False, 0.5, None)
    assert obj["obj"].startswith("<object object")


def test_json_exception_field() -> None:
    stream, log = emit("json")
    try:
        raise ValueError("bad")
    except ValueError:
        log.error("x", exc_info=True)
    assert json.loads(stream.getvalue())["exc"].endswith("ValueError: bad")


def test_stack_info_is_a_field() -> None:
    stream, log = emit("json")
    log.info("x", stack_info=True)
    assert json.loads(stream.getvalue())["stack"].startswith("Stack (most recent call last):")


def test_level_filters() -> None:
    stream, log = emit("logfmt", level="warning")
    log.info("quiet")
    log.warning("loud")
    assert "quiet" not in stream.getvalue() and "loud" in stream.getvalue()


def test_setup_twice_does_not_duplicate_lines() -> None:
    first, second = io.StringIO(), io.StringIO()
    setup_logging("info", "logfmt", first)
    setup_logging("debug", "json", second)
    logging.getLogger("gpumond.rules").debug("once")
    assert first.getvalue() == ""
    assert second.getvalue().count("\n") == 1 and json.loads(second.getvalue())["msg"] == "once"
    assert len(logging.getLogger("gpumond").handlers) == 1


def test_foreign_handlers_are_left_alone() -> None:
    logger = logging.getLogger("gpumond")
    theirs = logging.NullHandler()
    logger.addHandler(theirs)
    setup_logging("info", "logfmt", io.StringIO())
    setup_logging("info", "logfmt", io.StringIO())
    assert theirs in logger.handlers and len(logger.handlers) == 2


def test_records_still_reach_caplog(caplog: pytest.LogCaptureFixture) -> None:
    stream, log = emit("logfmt")
    with caplog.at_level(logging.INFO, logger="gpumond"):
        log.info("seen by both")
    assert "seen by both" in caplog.text and "seen by both" in stream.getvalue()


def test_default_stream_is_stderr_at_call_time(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging()
    logging.getLogger("gpumond").info("to stderr")
    assert "to stderr" in capsys.readouterr().err


@pytest.mark.parametrize(("level", "fmt"), [("verbose", "logfmt"), ("info", "xml")])
def test_bad_settings_raise(level: str, fmt: str) -> None:
    with pytest.raises(ValueError):
        setup_logging(level, fmt, io.StringIO())


def test_formatters_are_usable_alone() -> None:
    record = logging.LogRecord("other", logging.ERROR, __file__, 1, "m", (), None)
    record.created = time.time()
    assert json.loads(JsonFormatter().format(record))["logger"] == "other"


# ----- foreign loggers and floods -----------------------------------------------------------------

def test_foreign_loggers_write_the_same_one_line_format_once() -> None:
    stream, _ = emit("logfmt")
    logging.getLogger("uvicorn.error").warning("Invalid HTTP request received.")
    logging.getLogger("uvicorn.error").info("below WARNING: library noise, not written")
    try:
        raise OSError(24, "Too many open files")
    except OSError:
        logging.getLogger("asyncio").error("socket.accept() out of system resource\nsocket: <socket>", exc_info=True)
    logging.getLogger("gpumond.agent").warning("ours, once")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3, lines
    fields = [parse_logfmt(line) for line in lines]
    assert [(f["logger"], f["level"]) for f in fields] == [("uvicorn.error", "warning"), ("asyncio", "error"),
                                                            ("gpumond.agent", "warning")]
    assert fields[1]["msg"].startswith("socket.accept() out of system resource\n")  # escaped, one line
    assert "Too many open files" in fields[1]["exc"]


def test_warnings_and_thread_errors_become_log_lines() -> None:
    import warnings

    stream, _ = emit("json")
    warnings.warn("something deprecated", DeprecationWarning, stacklevel=1)
    t = threading.Thread(target=lambda: 1 / 0, name="worker-1")
    t.start()
    t.join()
    objects = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert objects[0]["logger"] == "py.warnings" and "something deprecated" in objects[0]["msg"]
    assert objects[1]["msg"] == "unhandled exception in a thread" and objects[1]["thread_name"] == "worker-1"
    assert "ZeroDivisionError" in objects[1]["exc"]


def test_a_flood_from_one_call_site_is_cut_to_a_burst_and_its_count_reported() -> None:
    from gpumond.logs import BURST, WINDOW_S, RateLimit

    stream, log = emit("logfmt")
    clock = FakeClock()
    limit = next(f for f in logging.getLogger("gpumond").handlers[-1].filters if isinstance(f, RateLimit))
    assert isinstance(limit, RateLimit)
    limit._clock = clock
    for i in range(500):
        log.warning("invalid request", extra={"n": i})  # one call site
    log.warning("another event")  # another site is not held back by the flood
    lines = [parse_logfmt(line) for line in stream.getvalue().splitlines()]
    assert len(lines) == BURST + 1 and lines[-1]["msg"] == "another event"
    clock.now += WINDOW_S
    for _ in range(2):
        log.warning("invalid request", extra={"n": "later"})
    lines = [parse_logfmt(line) for line in stream.getvalue().splitlines()]
    assert lines[BURST + 1]["suppressed"] == str(500 - BURST)  # the next line of the site carries the count
    assert "suppressed" not in lines[BURST + 2]


def test_a_site_that_falls_silent_gets_a_summary_line_and_exit_flushes_the_rest() -> None:
    from gpumond.logs import BURST, WINDOW_S, RateLimit

    stream, log = emit("logfmt")
    clock = FakeClock()
    limit = next(f for f in logging.getLogger("gpumond").handlers[-1].filters if isinstance(f, RateLimit))
    limit._clock = clock
    for _ in range(BURST + 7):
        logging.getLogger("uvicorn.error").warning("Invalid HTTP request received.")
    clock.now += WINDOW_S + 1
    log.info("something else")  # any line lets the limiter report sites whose window ended
    lines = [parse_logfmt(line) for line in stream.getvalue().splitlines()]
    summary = [f for f in lines if f["msg"] == "repeated log lines suppressed"]
    assert len(summary) == 1 and summary[0]["suppressed"] == "7" and summary[0]["of_logger"] == "uvicorn.error"
    assert summary[0]["of_msg"] == "Invalid HTTP request received."
    for _ in range(BURST + 3):
        logging.getLogger("uvicorn.error").warning("Invalid HTTP request received.")
    limit.flush()  # what atexit does
    lines = [parse_logfmt(line) for line in stream.getvalue().splitlines()]
    assert lines[-1]["msg"] == "repeated log lines suppressed" and lines[-1]["suppressed"] == "3"


def test_per_gpu_lines_get_a_budget_per_gpu_while_foreign_floods_stay_cut() -> None:
    from gpumond.logs import BURST, WINDOW_S, RateLimit

    stream, _ = emit("logfmt")
    clock = FakeClock()
    limit = next(f for f in logging.getLogger("gpumond").handlers[-1].filters if isinstance(f, RateLimit))
    limit._clock = clock
    nvml = logging.getLogger("gpumond.nvml")

    def gpu_lost(i: int) -> None:  # one call site, like the session's
        nvml.error("gpu lost", extra={"gpu": i, "uuid": f"GPU-{i}"})

    for i in range(16):  # 16 GPUs lost at once: 16 distinct events
        gpu_lost(i)
    for _ in range(BURST + 5):  # one GPU flapping is still cut to a burst
        gpu_lost(3)
    for _ in range(BURST + 5):  # a library's lines are keyed by site only, whatever they carry
        logging.getLogger("somelib").warning("noise", extra={"gpu": 7})
    lines = [parse_logfmt(line) for line in stream.getvalue().splitlines()]
    lost = [f for f in lines if f["msg"] == "gpu lost"]
    assert sorted({f["gpu"] for f in lost[:16]}, key=int) == [str(i) for i in range(16)]
    assert len(lost) == 16 + BURST - 1  # GPU 3 had one line of its burst already
    assert len([f for f in lines if f["msg"] == "noise"]) == BURST
    clock.now += WINDOW_S + 1
    nvml.info("something else")
    lines = [parse_logfmt(line) for line in stream.getvalue().splitlines()]
    summary = {f["of_logger"]: f for f in lines if f["msg"] == "repeated log lines suppressed"}
    assert summary["gpumond.nvml"]["of_gpu"] == "3" and summary["gpumond.nvml"]["suppressed"] == "6"
    assert summary["somelib"]["suppressed"] == "5" and "of_gpu" not in summary["somelib"]


def test_a_level_above_warning_holds_for_foreign_loggers_too() -> None:
    stream, ours = emit("logfmt", level="error")
    logging.getLogger("apscheduler.scheduler").warning("Execution of job skipped: maximum number of running instances")
    ours.warning("ours, below error: not written")
    logging.getLogger("apscheduler.scheduler").error("written")
    lines = [parse_logfmt(line) for line in stream.getvalue().splitlines()]
    assert [(f["logger"], f["msg"]) for f in lines] == [("apscheduler.scheduler", "written")]


class _Built(logging.Filter):
    """Counts the records a logger makes (a logger's filters see every record made for it)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return True


def test_log_limited_builds_no_record_the_limit_holds_back_and_keeps_its_count() -> None:
    from gpumond.logs import BURST, WINDOW_S, RateLimit, log_limited

    stream, _ = emit("logfmt")
    logging.getLogger("gpumond").propagate = False  # pytest's own capture handler at the root has no limit
    clock = FakeClock()
    limit = next(f for f in logging.getLogger("gpumond").handlers[-1].filters if isinstance(f, RateLimit))
    limit._clock = clock
    log = logging.getLogger("gpumond.serving")
    built = _Built()
    log.addFilter(built)
    try:
        def evicted(i: int) -> None:  # one call site, as the connection guard's
            log_limited(log, logging.WARNING, "connection closed to make room", {"total": i})

        for i in range(500):
            evicted(i)
        log_limited(log, logging.WARNING, "another event")  # another site has its own budget
        assert len(built.records) == BURST + 1  # the 490 held back were never made
        site = built.records[0]
        assert site.pathname == __file__ and site.funcName == "evicted"  # the caller's line keys the budget
        lines = [parse_logfmt(line) for line in stream.getvalue().splitlines()]
        assert len(lines) == BURST + 1 and lines[-1]["msg"] == "another event"
        clock.now += WINDOW_S
        evicted(500)
        log.warning("not limited beforehand")
        lines = [parse_logfmt(line) for line in stream.getvalue().splitlines()]
        assert lines[BURST + 1]["msg"] == "connection closed to make room"
        assert lines[BURST + 1]["suppressed"] == str(500 - BURST)  # the count the filter alone would give
        assert limit.suppressed_total == 500 - BURST
        for _ in range(BURST + 4):
            evicted(0)
        limit.flush()  # the site fell silent: its summary line names it
        summary = parse_logfmt(stream.getvalue().splitlines()[-1])
        assert summary["msg"] == "repeated log lines suppressed" and summary["suppressed"] == "5"
        assert summary["of_msg"] == "connection closed to make room" and summary["of_logger"] == "gpumond.serving"
    finally:
        log.removeFilter(built)


def test_log_limited_makes_every_record_when_a_handler_has_no_limit(caplog: pytest.LogCaptureFixture) -> None:
    from gpumond.logs import BURST, log_limited

    emit("logfmt")  # gpumond's handler has the limit; caplog's handler at the root has none
    log = logging.getLogger("gpumond.serving")
    with caplog.at_level(logging.WARNING):
        for _ in range(BURST + 5):
            log_limited(log, logging.WARNING, "connection shed")
    assert len([r for r in caplog.records if r.getMessage() == "connection shed"]) == BURST + 5
    logging.getLogger("gpumond").setLevel(logging.ERROR)
    log_limited(log, logging.WARNING, "below the level")
    assert "below the level" not in caplog.text
