"""The XID table: required codes, severities, unknown codes, and docs/xid.md kept in step."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpumond.agent.policy.xid_table import XID_TABLE, xid_info

DOC = Path(__file__).resolve().parents[2] / "docs" / "xid.md"


def test_the_codes_operators_meet_are_all_there() -> None:
    required = {13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120}
    assert required <= set(XID_TABLE)
    assert all(code == info.code for code, info in XID_TABLE.items())


@pytest.mark.parametrize("code", [13, 31, 43, 45, 68])
def test_application_caused_xids_are_info(code: int) -> None:
    assert xid_info(code).severity == "info" and xid_info(code).application


@pytest.mark.parametrize(
    ("code", "severity"),
    [(48, "critical"), (63, "warning"), (64, "critical"), (74, "critical"), (79, "critical"),
     (92, "warning"), (94, "warning"), (95, "critical"), (119, "critical"), (120, "critical")],
)
def test_hardware_xids(code: int, severity: str) -> None:
    assert xid_info(code).severity == severity and not xid_info(code).application


def test_unknown_xid_is_a_warning_with_a_pointer() -> None:
    info = xid_info(4242)
    assert (info.code, info.severity) == (4242, "warning")
    assert info.meaning == "unknown XID, see nvidia-smi -q and dmesg"


def test_every_entry_says_what_to_do() -> None:
    assert all(info.meaning and info.action for info in XID_TABLE.values())


def test_docs_table_matches_the_code() -> None:
    rows = re.findall(r"^\| (\d+) \| (critical|warning|info) \|", DOC.read_text(), flags=re.MULTILINE)
    assert {int(code): severity for code, severity in rows} == {c: i.severity for c, i in XID_TABLE.items()}
