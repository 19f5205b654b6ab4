"""Safe labels: the push API refuses unsafe characters, and every printer escapes any that get through.

Unsafe (gpumond.wire.safetext): C0/C1 controls and DEL, U+2028/U+2029, bidirectional controls. A job name holding
U+0085 or U+2028 would split a log line or a table row; U+202E would make `job-evil` read as `live-boj`.
"""

from __future__ import annotations

import io
import json
import logging
import re
import sys
import threading

import pytest

from gpumond.cli.findings import table
from gpumond.wire.identity import clean_label
from gpumond.logs import setup_logging
from gpumond.textformat import Encoder
from gpumond.types import Series
from gpumond.wire.safetext import UNSAFE, escape_unsafe, first_unsafe, one_line, shorten

# Everything the Unicode standard treats as a line break, for "is this still one line?"
LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_log_lines_escape_unsafe_characters_in_message_fields_and_exceptions(fmt: str) -> None:
    logger, root = logging.getLogger("gpumond"), logging.getLogger()
    saved = (logger.handlers[:], logger.level, root.handlers[:], root.level)
    hooks = (threading.excepthook, sys.unraisablehook)
    stream = io.StringIO()
    try:
        setup_logging("info", fmt, stream)
        log = logging.getLogger("gpumond.rules")
        evil = "job\u2028level=error msg=forged\x85\u202edab"
        log.warning(f"push refused {evil}", extra={"job": evil})
        try:
            raise ValueError(evil)
        except ValueError:
            log.exception("failed")
    finally:
        logger.handlers[:], logger.level, root.handlers[:], root.level = saved
        threading.excepthook, sys.unraisablehook = hooks
        logging.captureWarnings(False)
    text = stream.getvalue()
    lines = text.split("\n")
    assert len(lines) == 3 and lines[-1] == ""  # two records, two lines
    for line in lines[:2]:
        assert LINE_BREAKS.search(line) is None and UNSAFE.search(line) is None, repr(line)
    assert "\\u2028" in lines[0] and "\\u202e" in lines[0]
    if fmt == "json":
        assert json.loads(lines[0])["job"] == evil  # JSON's \uXXXX decodes to the very same value


def test_metrics_label_values_show_unsafe_characters_as_codes() -> None:
    out = Encoder({"gpumond_finding": ("gauge", "A finding.")}).encode([Series("gpumond_finding", (("job", "a\u2028b\u202ec\\u"), ("node", 'n"1\n')), 1.0)])
    text = out.decode()
    assert text.count("\n") == 3  # HELP, TYPE, one sample: nothing split the sample line
    assert UNSAFE.search(text.replace("\n", "")) is None
    assert 'job="a\\\\u2028b\\\\u202ec\\\\u",node="n\\"1\\n"' in text


def test_findings_table_rows_stay_one_line_each_and_in_order() -> None:
    finding = {"kind": "straggler", "state": "firing", "job": "job\u202eevil", "node": "n\u2028x", "rank": 1,
               "gpu_uuid": "GPU-1", "score": 5.0, "since": 0.0, "evidence": {}}
    out = table([finding], now=10.0)
    assert len(out.splitlines()) == 2 and LINE_BREAKS.search(out.replace("\n", "")) is None
    assert "job\\u202eevil" in out and "n\\u2028x" in out and UNSAFE.search(out.replace("\n", "")) is None


def test_job_ids_from_the_environment_drop_unsafe_values() -> None:
    assert clean_label("slurm-123\u202e") is None and clean_label("slurm-123") == "slurm-123"
    assert clean_label("r\u2028x") is None


def test_escape_unsafe_and_first_unsafe() -> None:
    assert escape_unsafe("plain") == "plain"
    assert escape_unsafe("a\u2028b\x85") == "a\\u2028b\\u0085"
    assert first_unsafe("ok\u2066x\u2028") == "U+2066" and first_unsafe("ok") is None


def test_shorten_cuts_at_a_word_boundary_within_the_limit() -> None:
    assert shorten("short", 10) == "short"
    assert shorten("alpha beta gamma delta", 12) == "alpha beta…"
    assert shorten("x" * 50, 10) == "x" * 9 + "…"  # no word boundary near: cut mid-word
    assert shorten("line one\nline two", 100) == "line one\nline two"  # newlines kept: a description


def test_one_line_collapses_whitespace_and_is_bounded() -> None:
    assert one_line("a\n  b\r\n\tc") == "a b c"
    assert one_line("word " * 200, 50) == shorten(("word " * 200).strip(), 50) and len(one_line("w " * 500)) <= 300
    assert one_line(ValueError()) == "ValueError"
    assert one_line(OSError(111, "Connection refused")) == "[Errno 111] Connection refused"
