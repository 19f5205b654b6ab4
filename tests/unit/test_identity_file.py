"""The agent's record of its GPUs' identities (state_dir/gpus.json): round trip, and what it does when it cannot."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from gpumond.agent.identity_file import IdentityFile
from gpumond.nvml.session import GpuIdentity

A = GpuIdentity(0, "GPU-11111111-2222-3333-4444-555555555555", "NVIDIA H100 80GB HBM3", "00000000:1B:00.0", 0)
B = GpuIdentity(1, "GPU-66666666-7777-8888-9999-000000000000", "NVIDIA H100 80GB HBM3", "00000000:43:00.0", None)
NAMELESS = GpuIdentity(2, "", "", "")


def test_round_trip_keeps_only_gpus_that_were_read(tmp_path: Path) -> None:
    f = IdentityFile(tmp_path / "gpus.json")
    assert f.load() == {}
    f.save([B, NAMELESS, A])
    assert IdentityFile(tmp_path / "gpus.json").load() == {0: A, 1: B}


def test_an_unchanged_set_is_not_written_again(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    f = IdentityFile(path)
    f.save([A, B])
    path.write_text("sentinel")  # would be overwritten by a second write
    f.save([B, A])
    assert path.read_text() == "sentinel"
    f.save([A])  # a change is written
    assert IdentityFile(path).load() == {0: A}


def test_a_corrupt_or_foreign_record_is_ignored_with_one_error_and_kept(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.WARNING)
    path = tmp_path / "gpus.json"
    for text in ("{not json", '{"version": 99, "gpus": []}', '{"version": 1, "gpus": [{"index": "x"}]}', "[]",
                 "[" * 100_000):
        path.write_text(text)
        assert IdentityFile(path).load() == {}
    said = [r for r in caplog.records if r.getMessage().startswith("gpu identity file")]
    assert len(said) == 5, [r.getMessage() for r in caplog.records]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "gpus.json.corrupt.1", "gpus.json.corrupt.2", "gpus.json.corrupt.3", "gpus.json.corrupt.4",
        "gpus.json.rejected.1"]


def test_a_bad_entry_is_left_out_and_the_others_used(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    IdentityFile(path).save([A, B])
    doc = json.loads(path.read_text())
    doc["gpus"].append({"index": "x"})
    path.write_text(json.dumps(doc))
    assert IdentityFile(path).load() == {0: A, 1: B}


def test_an_unwritable_state_dir_is_said_once_and_retried(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="gpumond.agent")
    blocker = tmp_path / "file"
    blocker.write_text("")
    f = IdentityFile(blocker / "gpus.json")  # a directory that cannot exist
    f.save([A])
    f.save([A, B])
    assert len([r for r in caplog.records if r.getMessage() == "cannot record gpu identities"]) == 1
    ok = IdentityFile(tmp_path / "gpus.json")
    ok.save([A])
    assert ok.load() == {0: A}


def test_no_path_means_no_record(tmp_path: Path) -> None:
    f = IdentityFile(None)
    f.save([A])
    assert f.load() == {}
