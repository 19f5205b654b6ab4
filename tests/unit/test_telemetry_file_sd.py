"""Scrape targets and Prometheus file_sd files: parsing, reload on change, a broken file keeps the last list."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpumond.rules.telemetry import FileSD, parse_file_sd, parse_target


@pytest.mark.parametrize(("spec", "url", "host"), [
    ("gpu-node-01:9480", "http://gpu-node-01:9480/metrics", "gpu-node-01"),
    ("10.0.0.7:9480", "http://10.0.0.7:9480/metrics", "10.0.0.7"),
    ("[fd00::7]:9480", "http://[fd00::7]:9480/metrics", "fd00::7"),
    ("https://gpu-node-02:9443/custom", "https://gpu-node-02:9443/custom", "gpu-node-02"),
    ("http://gpu-node-03:9480", "http://gpu-node-03:9480/metrics", "gpu-node-03"),
])
def test_parse_target_forms(spec: str, url: str, host: str) -> None:
    t = parse_target(spec)
    assert (t.address, t.url, t.host, t.node) == (spec, url, host, None)


def test_parse_target_honours_prometheus_meta_labels_and_node() -> None:
    t = parse_target("n1:9480", {"__scheme__": "https", "__metrics_path__": "/m", "node": "rack1-n1", "dc": "x"})
    assert (t.url, t.node) == ("https://n1:9480/m", "rack1-n1")


@pytest.mark.parametrize("spec", ["", "   ", "gpu-node-01", "gpu-node-01:port", "a b:1", "ftp://x:1/",
                                  "host:9480/metrics", ":9480", 9480])
def test_parse_target_rejects_nonsense(spec: object) -> None:
    with pytest.raises(ValueError, match="target"):
        parse_target(spec)  # type: ignore[arg-type]


def test_parse_file_sd_json_groups_with_node_labels() -> None:
    text = json.dumps([
        {"targets": ["10.0.0.1:9480", "10.0.0.2:9480"], "labels": {"node": "n-a"}},
        {"targets": ["10.0.0.3:9480", "10.0.0.1:9480"]},  # a repeat: the first group wins
    ])
    got = [(t.url, t.node) for t in parse_file_sd(text)]
    assert got == [("http://10.0.0.1:9480/metrics", "n-a"), ("http://10.0.0.2:9480/metrics", "n-a"),
                   ("http://10.0.0.3:9480/metrics", None)]


def test_parse_file_sd_yaml_and_empty_yaml() -> None:
    text = "- targets: ['10.0.0.1:9480']\n  labels: {node: n-a}\n"
    assert [(t.host, t.node) for t in parse_file_sd(text, yaml_syntax=True)] == [("10.0.0.1", "n-a")]
    assert parse_file_sd("", yaml_syntax=True) == []
    with pytest.raises(ValueError, match="duplicate key 'targets'"):
        parse_file_sd("- targets: ['10.0.0.1:9480']\n  targets: ['10.0.0.2:9480']\n", yaml_syntax=True)


@pytest.mark.parametrize(("text", "message"), [
    ("[{", "not valid JSON"),
    ('{"targets": ["a:1"]}', "top level must be a list"),
    ('["a:1"]', r"\[0\]: a target group must be an object"),
    ('[{"labels": {}}]', r"\[0\]\.targets: must be a list"),
    ('[{"targets": ["a:1"], "labels": {"node": 7}}]', r"\[0\]\.labels: must map label names to strings"),
    ('[{"targets": ["a:1"]}, {"targets": ["ok:1", "bad"]}]', r"\[1\]\.targets\[1\]: target 'bad'"),
])
def test_parse_file_sd_errors_name_the_fault(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_file_sd(text)


def _write(path: Path, groups: object, *, mtime_ns: int) -> None:
    path.write_text(groups if isinstance(groups, str) else json.dumps(groups), encoding="utf-8")
    # Explicit mtimes: two writes within one filesystem tick must still look like a change.
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_file_sd_reloads_on_change_and_keeps_last_good_list_when_broken(tmp_path: Path) -> None:
    path = tmp_path / "targets.json"
    _write(path, [{"targets": ["10.0.0.1:9480"], "labels": {"node": "n-a"}}], mtime_ns=1_000_000_000)
    sd = FileSD(path)
    targets, error = sd.current()
    assert ([t.node for t in targets], error) == (["n-a"], None)

    _write(path, [{"targets": ["10.0.0.1:9480", "10.0.0.2:9480"]}], mtime_ns=2_000_000_000)
    targets, error = sd.current()
    assert ([t.host for t in targets], error) == (["10.0.0.1", "10.0.0.2"], None)

    _write(path, '[{"targets": ["10.0.0.9:9480"', mtime_ns=3_000_000_000)  # half-written
    targets, error = sd.current()
    assert [t.host for t in targets] == ["10.0.0.1", "10.0.0.2"]
    assert error is not None and "not valid JSON" in error and "keeping 2 previous targets" in error
    assert sd.current()[1] == error  # stays reported while the file stays broken

    _write(path, [{"targets": ["10.0.0.9:9480"]}], mtime_ns=4_000_000_000)
    targets, error = sd.current()
    assert ([t.host for t in targets], error) == (["10.0.0.9"], None)


def test_file_sd_is_not_reread_while_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "targets.json"
    _write(path, [{"targets": ["10.0.0.1:9480"]}], mtime_ns=1_000_000_000)
    reads = []
    sd = FileSD(path)
    real_read = Path.read_text

    def counting_read(self: Path, *a: object, **kw: object) -> str:
        reads.append(self)
        return real_read(self, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", counting_read)
    for _ in range(3):
        sd.current()
    assert len(reads) == 1


def test_file_sd_missing_file_is_an_error_and_reappearing_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "targets.yml"
    sd = FileSD(path)
    targets, error = sd.current()
    assert targets == [] and error is not None and "cannot read" in error
    path.write_text("- targets: ['10.0.0.5:9480']\n", encoding="utf-8")
    targets, error = sd.current()
    assert ([t.host for t in targets], error) == (["10.0.0.5"], None)
    path.unlink()
    targets, error = sd.current()
    assert [t.host for t in targets] == ["10.0.0.5"] and error is not None and "cannot read" in error
