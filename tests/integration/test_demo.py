"""`gpumond demo` end to end: agents on simulated GPUs, job pushes over HTTP through the real SDK, the rules
service scraping the agents — each planted fault comes out as the right finding or alert on the right node,
GPU index and rank, resolves once the fault ends, and the demo ends early when everything has."""

import re
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration

DURATION_S = 150  # the upper bound; at --speed 4 everything is found and resolved in about 85 s


def summary_rows(out: str) -> dict[str, list[tuple[str, str, str, str]]]:
    """The summary table as fault key → [(where, what fired, fired, resolved)], read by column position: a fault's
    own line (`<key> on <where>: …`) heads the rows of what fired for it; a row's first cell may wrap."""
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("what fired "))
    starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", lines[head])]
    rows: dict[str, list[tuple[str, str, str, str]]] = {}
    key, where = "", ""
    for line in lines[head + 2:]:
        if not line.strip():
            break
        if heading := re.match(r"(\S+) on (.+?): ", line):
            key, where = heading.groups()
            continue
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        if re.fullmatch(r"[+-]\d+ s", cells[1]):
            rows.setdefault(key, []).append((where, cells[0], cells[1], cells[2]))
        elif line.startswith("    ") and rows.get(key) and not any(cells[1:]):  # the row's first cell, wrapped
            w, what, when, resolved = rows[key][-1]
            rows[key][-1] = (w, f"{what} {cells[0]}", when, resolved)
    return rows


def test_demo_finds_every_planted_fault_where_it_was_planted_and_ends_when_all_resolved():
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "gpumond.cli", "demo", "--nodes", "3", "--duration", str(DURATION_S),
                        "--speed", "4"], capture_output=True, text=True, timeout=DURATION_S + 90)
    took = time.monotonic() - t0
    out = p.stdout
    assert p.returncode == 0, (out[-3000:], p.stderr[-2000:])

    # The installed default is dry_run; the demo says that its simulated agents enforce, and they do (POLICY acts).
    assert "The agents' power policy enforces here (policy: {mode: enforce}: the GPUs are simulated)" in out, out
    # The live story names node, GPU index and rank, and the fault each line belongs to.
    assert re.search(r"FINDING FIRING +straggler on demo-node-01 · GPU 3 · rank 11 +← planted: cooling", out), out
    assert re.search(r"FINDING FIRING +io_starved_rank on demo-node-02 · GPU 5 · rank 21 +← planted: loader",
                     out), out
    assert re.search(r"ALERT +FIRING +GpuXidCritical on demo-node-00 · GPU 6 · rank 6 +← planted: xid",
                     out), out
    assert re.search(r"POLICY +acts +thermal power cap on demo-node-01 · GPU 3 · rank 11: "
                     r"power limit 700 W → \d+ W, cut \(temperature \d+ °C\) +← planted: cooling", out), out
    # The planted loader stall loads no CPU or disk: the cause is worded as what was ruled out, never "unknown".
    assert "unknown" not in out
    assert re.search(r"likely cause: (not CPU or disk contention on the host \(demo-node-02|CPU|storage)", out), out

    # Every planted fault paged through both sinks once, and once more when it was over (that each payload is
    # one Slack and PagerDuty accept is held by the alert-sink tests, against tests/service_payloads.py).
    for name, place in (("TrainingStraggler", "demo-node-01 · GPU 3 · rank 11"),
                        ("TrainingIoStarvedRank", "demo-node-02 · GPU 5 · rank 21"),
                        ("GpuXidCritical", "demo-node-00 · GPU 6 · rank 6")):
        for via in ("pagerduty", "slack"):
            for state in ("FIRING", "resolved"):
                lines = re.findall(rf"PAGE +{state} +{name} via {via} on {place} ", out)
                assert len(lines) == 1, (name, via, state, out)
    assert not re.search(r"PAGE +resolved +GpuRowRemapPending", out)  # pending until a reset: still open

    # It ended because everything was found and resolved, well before --duration.
    assert "everything planted was found and has resolved: ending early" in out, out
    assert took < DURATION_S, took

    rows = summary_rows(out)
    fired = {k: {what: (where, when, resolved) for where, what, when, resolved in v} for k, v in rows.items()}
    assert fired["cooling"]["thermal power cap"][0] == "demo-node-01 · GPU 3 · rank 11"
    assert "finding straggler" in fired["cooling"] or "finding straggler (fired 2×)" in fired["cooling"], rows
    assert fired["loader"]["finding io_starved_rank"][0] == "demo-node-02 · GPU 5 · rank 21"
    assert fired["xid"]["alert GpuXidCritical"][0] == "demo-node-00 · GPU 6 · rank 6"
    assert fired["xid"]["alert GpuEccUncorrectedIncreasing"][2].startswith("+")  # resolved within the demo
    remap = "alert GpuRowRemapPending (stays until an operator resets the GPU)"
    assert fired["xid"][remap][2] == "still firing", rows
    for key, signals in fired.items():
        for what, (_, when, resolved) in signals.items():
            assert re.fullmatch(r"\+\d+ s", when), (key, what, when)
            assert re.fullmatch(r"\+\d+ s", resolved) or what == remap, (key, what, resolved)
    start = out.index("faults planted:")
    summary = out[start:out.index("Where to look", start)]
    assert max(len(line) for line in summary.splitlines()) <= 80, summary
    assert "3 faults planted: 3 found, 3 found and resolved; 0 false alarms." in out, out
    assert "Fired without a planted fault (false alarms): none." in out, out
    assert "rerun with --keep" in out or "run with --keep" in out
    assert re.search(r"gpumond findings --url http://127\.0\.0\.1:\d+", out)
