"""`gpumond findings`: the --url is checked before anything is fetched; answers become one table or one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpumond.cli import main
from gpumond.findings_cli import base_url, table
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
