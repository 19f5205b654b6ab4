"""`gpumond findings`: the --url is checked before anything is fetched; answers become one table or one line."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from gpumond.cli import main
from gpumond.findings_cli import base_url, measure, table
from tests.unit.test_alerts_cli import JSON, serving

FINDINGS = [
    {"kind": "io_starved_rank", "job": "llama-70b-r3", "node": "gpu-node-02", "rank": 5, "gpu_uuid": None,
     "score": 4.1, "since": 1_763_759_900.0, "state": "pending", "evidence": {"data_wait_frac": 0.4}},
    {"kind": "straggler", "job": "llama-70b-r3", "node": "gpu-node-01", "rank": 0,
     "gpu_uuid": "GPU-5b0c3b0a-0000-4000-8000-000000000001", "score": 7.5, "since": 1_763_759_700.0,
     "state": "firing", "evidence": {"signals": {"sm_clock": {"value": 1.41e9, "peer_median": 1.98e9}}}},
]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumond.cli", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("url, line", [
    ("not-a-url", "gpumond findings: argument --url: not-a-url: missing scheme; use http://not-a-url:9481"),
    ("127.0.0.1:9481", "gpumond findings: argument --url: 127.0.0.1:9481: missing scheme; use http://127.0.0.1:9481"),
])
def test_a_url_without_scheme_is_one_line_exit_2_that_says_what_to_type(url: str, line: str) -> None:
    p = run("findings", "--url", url)
    assert p.returncode == 2, p.stderr
    assert p.stdout == "" and "Traceback" not in p.stderr
    assert p.stderr.splitlines() == [f"{line} (see: gpumond findings --help)"]


@pytest.mark.parametrize("url, fragment", [
    ("ftp://rules:9481", "scheme 'ftp' is not supported; use http:// or https://"),
    ("http://", "no host; e.g. http://127.0.0.1:9481"),
    ("http://rules:99999", "the port must be a number from 1 to 65535"),
    ("http://rules:9481/?job=x", "give the base URL only, without '?' or '#'"),
    ("http//rules", "is not an http:// or https:// URL; e.g. http://127.0.0.1:9481"),
])
def test_other_bad_urls_are_usage_errors(url: str, fragment: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["findings", "--url", url])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err


def test_an_unknown_kind_is_a_usage_error_not_an_empty_fleet(capsys) -> None:
    # The service filters by any string: a typo would print "no findings" and exit 0.
    with pytest.raises(SystemExit) as info:
        main(["findings", "--url", "http://127.0.0.1:9", "--kind", "straggle"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'straggle'" in err and "io_starved_rank" in err, err


@pytest.mark.parametrize("url, expected", [
    ("http://rules:9481", "http://rules:9481"),
    ("https://gateway.example/gpumond/", "https://gateway.example/gpumond"),
    (" http://[::1]:9481/ ", "http://[::1]:9481"),
])
def test_good_base_urls_pass(url: str, expected: str) -> None:
    assert base_url(url, 9481) == expected


def test_findings_are_fetched_with_filters_and_printed_firing_first(capsys) -> None:
    routes = {"/api/v1/findings": (200, JSON, json.dumps({"findings": FINDINGS}).encode())}
    with serving(routes) as (url, seen):
        assert main(["findings", "--url", url + "/", "--job", "llama-70b-r3", "--state", "firing"]) == 0
    assert seen == ["/api/v1/findings?job=llama-70b-r3&state=firing"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["KIND", "STATE", "JOB"]
    assert [line.split()[0] for line in lines[1:]] == ["straggler", "io_starved_rank"]
    assert "GPU-5b0c3b0a-00…" in lines[1] and "sm_clock 1410000000.0 vs 1980000000.0" in lines[1]
    assert table([]) == "no findings"


@pytest.mark.parametrize("body, fragment", [
    (b"[1, 2]", "the answer has no 'findings' list of objects"),
    (b"\xff\xfe not text", "the answer is not JSON"),
])
def test_an_answer_of_the_wrong_shape_is_one_line_exit_1(body: bytes, fragment: str, capsys) -> None:
    with serving({"/api/v1/findings": (200, JSON, body)}) as (url, _):
        assert main(["findings", "--url", url]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpumond findings: ") and fragment in err, err


def test_help_teaches_with_examples() -> None:
    p = run("findings", "--help")
    assert p.returncode == 0 and "gpumond findings --url http://rules:9481" in p.stdout


# ----- units, and what "no findings" means ------------------------------------------------------------------
@pytest.mark.parametrize("finding, expected", [
    ({"kind": "straggler", "score": 7.46, "evidence": {"threshold_z": 3.9}}, "z 7.5 vs peers (flags at 3.9)"),
    ({"kind": "straggler_node", "score": 5.0, "evidence": {"threshold_z": 3.5, "gpus_flagged": 3, "gpus_on_node": 8}},
     "z 5.0 vs peers (flags at 3.5), 3/8 GPUs"),
    # The score of an io_starved_rank is a z-score with enough peers and the wait share without: the column
    # shows the share, which means the same either way.
    ({"kind": "io_starved_rank", "score": 0.35,
      "evidence": {"data_wait_frac": 0.3512, "peer_median_data_wait_frac": 0.021}},
     "data wait 35% of step (peers 2%)"),
    ({"kind": "io_starved_job", "score": 0.45, "evidence": {"median_data_wait_frac": 0.4512, "ranks_starved": 12,
                                                             "ranks": 16}},
     "data wait 45% of step (median), 12/16 ranks"),
    ({"kind": "job_slowdown", "score": 1.106, "evidence": {"slowdown": 1.106}}, "step time ×1.11 of baseline"),
    ({"kind": "hung_rank", "score": 2.32, "evidence": {"stalled_for_s": 23.2, "limit_s": 10.0}},
     "no step for 23 s (limit 10 s)"),
    ({"kind": "something_new", "score": 2.0, "evidence": {}}, "score 2.0"),
], ids=lambda v: v["kind"] if isinstance(v, dict) else "")
def test_measure_says_each_kinds_quantity_with_its_unit(finding: dict, expected: str) -> None:
    assert measure(finding) == expected
    header, row = table([{**finding, "state": "firing", "job": "j", "since": 0.0}], now=1.0).splitlines()
    assert "MEASURE" in header and "SCORE" not in header and expected in row


def _rules_metrics(tmp_path, *, pushed: bool, telemetry: bool) -> bytes:
    """A real rules service's /metrics text, with or without a job's push and a telemetry target."""
    import asyncio

    import httpx

    from gpumond.config.rules import RulesConfig
    from gpumond.rules.service import RulesService

    token = "t" * 32
    scrape = {"targets": [f"127.0.0.1:{_closed_port()}"], "timeout_s": 0.5} if telemetry else {}
    service = RulesService(RulesConfig.model_validate({"tokens": [token], "state_dir": str(tmp_path),
                                                       "telemetry": {"scrape": scrape}}))
    try:
        if pushed:
            body = {"job": "llama", "rank": 0, "world_size": 2, "node": "n0",
                    "gpu_uuid": "GPU-5b0c3b0a-0000-4000-8000-000000000001",
                    "steps": [{"step": 1, "end": time.time(), "duration_s": 0.5, "data_wait_s": 0.0}]}
            async def push() -> httpx.Response:
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=service.app),
                                             base_url="http://rules") as client:
                    return await client.post("/api/v1/push", json=body, headers={"Authorization": f"Bearer {token}"})

            r = asyncio.run(push())
            assert r.status_code < 300, r.text
        if telemetry:
            service.evaluator.poll_telemetry()  # nothing listens there: the fetch fails
        return service.metrics()
    finally:
        service.stop()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("pushed, telemetry, expected", [
    (False, False, "no findings: no job has pushed to it yet (check GPUMOND_ENDPOINT and GPUMOND_TOKEN in the "
                   "training job); no GPU telemetry source configured (telemetry: in rules.yaml)"),
    (True, True, "no findings: 1 job(s) with 1 rank(s) pushing; GPU telemetry (scrape) configured but its last "
                 "fetch failed"),
], ids=["nothing-known", "a-job-and-a-failing-target"])
def test_no_findings_says_whether_any_job_or_telemetry_is_known(tmp_path, capsys, pushed: bool, telemetry: bool,
                                                                expected: str) -> None:
    routes = {"/api/v1/findings": (200, JSON, b'{"findings": []}'),
              "/metrics": (200, "text/plain", _rules_metrics(tmp_path, pushed=pushed, telemetry=telemetry))}
    with serving(routes) as (url, _):
        assert main(["findings", "--url", url]) == 0
    assert capsys.readouterr().out.strip() == expected
    with serving(routes) as (url, _):
        assert main(["findings", "--url", url, "--job", "llama"]) == 0
    assert capsys.readouterr().out.startswith("no findings for job llama: ")


def test_no_findings_from_a_service_without_metrics_still_answers(capsys) -> None:
    with serving({"/api/v1/findings": (200, JSON, b'{"findings": []}')}) as (url, _):
        assert main(["findings", "--url", url]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("no findings (what the service holds is unknown: ") and "/metrics" in out, out
