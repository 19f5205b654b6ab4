"""Findings are alerts: candidate → condition (labels, wording, evidence), dedup, and back after a restart."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import gpumond.rules.detectors as detectors_pkg
from gpumond.alerts.catalogue import ALERTS, FINDING_KINDS, KIND_TO_ALERT
from gpumond.alerts.lifecycle import AlertTracker, Entry
from gpumond.alerts.model import Alert
from gpumond.rules.detectors.candidate import Candidate
from gpumond.rules.findings import (FINDINGS_PERSISTENCE, conditions_of, finding_condition, finding_of,
                                    findings_of)

# The alert each finding kind is reported as (a rename here is a rename in every receiver's routing).
EXPECTED_ALERT = {
    "straggler": ("TrainingStraggler", "warning"),
    "straggler_node": ("TrainingStragglerNode", "warning"),
    "io_starved_rank": ("TrainingIoStarvedRank", "warning"),
    "io_starved_job": ("TrainingIoStarvedJob", "warning"),
    "job_slowdown": ("TrainingJobSlowdown", "warning"),
    "hung_rank": ("TrainingRankHung", "critical"),
}
UUID = "GPU-6f1d2c3b-aaaa-bbbb-cccc-0123456789ab"


def rank_candidate(kind: str = "straggler", score: float = 2.5, rank: int = 11, **kw: object) -> Candidate:
    evidence = kw.pop("evidence", {"slowdown": 1.31, "likely_cause": "thermal", "peers": [1.0, 1.01],
                                   "telemetry": {"sm_clock_hz": 1.2e9}})
    return Candidate(kind, "llama-70b", "node-07", rank, UUID, score, evidence, **kw)  # type: ignore[arg-type]


# ----- labels -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(EXPECTED_ALERT))
def test_labels_of_every_kind(kind: str) -> None:
    c = finding_condition(rank_candidate(kind), gpu_index="3")
    alertname, severity = EXPECTED_ALERT[kind]
    assert dict(c.labels) == {"alertname": alertname, "severity": severity, "job": "llama-70b", "node": "node-07",
                              "rank": "11", "uuid": UUID}
    assert severity == ALERTS[alertname].severity and KIND_TO_ALERT[kind] == alertname


def test_no_gpu_label_so_a_late_gpu_index_does_not_make_a_second_alert() -> None:
    without = finding_condition(rank_candidate(), gpu_index=None)
    with_index = finding_condition(rank_candidate(), gpu_index="3")
    assert "gpu" not in dict(with_index.labels)
    assert without.fingerprint == with_index.fingerprint


def test_entity_parts_that_are_absent_are_not_labels() -> None:
    c = finding_condition(Candidate("job_slowdown", "j1", score=1.8))
    assert dict(c.labels) == {"alertname": "TrainingJobSlowdown", "severity": "warning", "job": "j1"}
    node = finding_condition(Candidate("straggler_node", "j1", "node-07", score=2.0))
    assert dict(node.labels) == {"alertname": "TrainingStragglerNode", "severity": "warning", "job": "j1",
                                 "node": "node-07"}


def test_rank_zero_is_a_label() -> None:
    assert dict(finding_condition(rank_candidate(rank=0)).labels)["rank"] == "0"


def test_unknown_kind_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="no alert"):
        finding_condition(Candidate("bogus", "j1"))


# ----- annotations ------------------------------------------------------------------------------------
def test_summary_names_rank_node_gpu_index_and_job() -> None:
    c = finding_condition(rank_candidate(), gpu_index="3")
    assert dict(c.annotations)["summary"] == "rank 11 (node-07 GPU 3) of job llama-70b: straggler rank"
    c = finding_condition(rank_candidate(), gpu_index=None)
    assert dict(c.annotations)["summary"] == "rank 11 (node-07) of job llama-70b: straggler rank"


def test_summary_of_node_and_job_findings() -> None:
    node = finding_condition(Candidate("straggler_node", "j1", "node-07", score=2.0))
    assert dict(node.annotations)["summary"] == "node node-07 in job j1: straggler node"
    job = finding_condition(Candidate("hung_rank", "j1", score=3.0))
    assert dict(job.annotations)["summary"] == "job j1: rank or job hung"


def test_description_is_the_meaning_and_a_headline_of_the_evidence() -> None:
    ann = dict(finding_condition(rank_candidate()).annotations)
    assert ann["description"].startswith(ALERTS["TrainingStraggler"].meaning)
    assert ann["description"].endswith("Evidence: likely_cause thermal; slowdown 1.31.")
    bare = dict(finding_condition(rank_candidate(evidence={})).annotations)
    assert bare["description"] == ALERTS["TrainingStraggler"].meaning


def test_evidence_annotation_is_json_and_score_is_kept() -> None:
    evidence = {"slowdown": 1.31, "peers": [1.0, 1.01], "telemetry": {"sm_clock_hz": 1.2e9}, "odd": {1, 2}}
    ann = dict(finding_condition(rank_candidate(evidence=evidence, score=2.5)).annotations)
    parsed = json.loads(ann["evidence"])
    assert parsed["slowdown"] == 1.31 and parsed["peers"] == [1.0, 1.01]
    assert parsed["telemetry"] == {"sm_clock_hz": 1.2e9}
    assert isinstance(parsed["odd"], str)  # not JSON-able: its text, never an exception
    assert ann["score"] == "2.5"


def test_corroborated_fires_immediately_and_payload_is_the_candidate() -> None:
    cand = rank_candidate(corroborated=True)
    c = finding_condition(cand)
    assert c.immediate and c.payload is cand
    assert not finding_condition(rank_candidate()).immediate


# ----- conditions_of ------------------------------------------------------------------------------------
def test_conditions_of_keeps_the_highest_score_per_entity() -> None:
    low, high = rank_candidate(score=1.5), rank_candidate(score=4.0, evidence={"slowdown": 2.0})
    for order in ((low, high), (high, low)):
        (cond,) = conditions_of(order, lambda uuid: "3")
        assert cond.payload is high
        assert dict(cond.annotations)["score"] == "4"
        assert json.loads(dict(cond.annotations)["evidence"]) == {"slowdown": 2.0}


def test_conditions_of_keeps_distinct_entities_and_asks_gpu_index_by_uuid() -> None:
    asked: list[str] = []

    def gpu_index(uuid: str) -> str | None:
        asked.append(uuid)
        return "5"

    conds = conditions_of([rank_candidate(rank=1), rank_candidate(rank=2), rank_candidate("io_starved_rank", rank=1),
                           Candidate("job_slowdown", "llama-70b", score=1.2)], gpu_index)
    assert len(conds) == 4 and len({c.fingerprint for c in conds}) == 4
    assert asked == [UUID] * 3  # a job-level candidate has no GPU to ask about
    assert "GPU 5" in dict(conds[0].annotations)["summary"]


# ----- finding_of -----------------------------------------------------------------------------------------
def test_finding_of_a_live_entry_uses_the_candidate() -> None:
    cand = rank_candidate(score=2.5)
    tracker, _ = AlertTracker(persistence=FINDINGS_PERSISTENCE).update([finding_condition(cand)], 100.0)
    (entry,) = tracker.entries
    f = finding_of(entry)
    assert f is not None
    assert (f.kind, f.job, f.node, f.rank, f.gpu_uuid, f.score, f.since, f.state) == \
        ("straggler", "llama-70b", "node-07", 11, UUID, 2.5, 100.0, "pending")
    assert f.evidence == dict(cand.evidence)


@pytest.mark.parametrize("rank", [11, 0, None])
def test_finding_of_a_restored_entry_rebuilds_from_labels(rank: int | None) -> None:
    cond = finding_condition(rank_candidate(score=2.5, rank=rank), gpu_index="3")  # type: ignore[arg-type]
    recorded = Alert(cond.labels, cond.annotations, 50.0)
    tracker = AlertTracker(persistence=FINDINGS_PERSISTENCE).restore([recorded], hold_until=200.0)
    (entry,) = tracker.entries
    assert entry.payload is None
    f = finding_of(entry)
    assert f is not None
    assert (f.kind, f.job, f.node, f.rank, f.gpu_uuid, f.score, f.since, f.state) == \
        ("straggler", "llama-70b", "node-07", rank, UUID, 2.5, 50.0, "firing")
    assert f.evidence["restored"] is True
    assert f.evidence["slowdown"] == 1.31 and f.evidence["telemetry"] == {"sm_clock_hz": 1.2e9}


def test_finding_of_a_restored_entry_with_broken_evidence_still_works() -> None:
    cond = finding_condition(Candidate("job_slowdown", "j1", score=1.7))
    labels = cond.labels
    entry = Entry(Alert(labels, (("evidence", "{not json"),), 10.0), 10.0)
    f = finding_of(entry)
    assert f is not None and (f.kind, f.job, f.rank, f.node, f.gpu_uuid) == ("job_slowdown", "j1", None, None, None)
    assert f.evidence == {"restored": True} and f.score == 0.0


def test_finding_of_is_none_for_other_alerts_and_resolved_ones() -> None:
    wd = Alert((("alertname", "Watchdog"), ("severity", "info")), (), 0.0)
    assert finding_of(Entry(wd, 0.0)) is None
    cond = finding_condition(rank_candidate())
    resolved = Alert(cond.labels, cond.annotations, 0.0, 10.0, "resolved")
    assert finding_of(Entry(resolved, 0.0, rank_candidate())) is None


def test_findings_of_sorts_by_score() -> None:
    conds = conditions_of([rank_candidate(rank=1, score=1.0), rank_candidate(rank=2, score=9.0),
                           rank_candidate(rank=3, score=4.0)], lambda uuid: None)
    tracker, _ = AlertTracker(persistence=FINDINGS_PERSISTENCE).update(conds, 0.0)
    assert [f.rank for f in findings_of(tracker.entries)] == [2, 3, 1]


# ----- the catalogue covers every detector ------------------------------------------------------------
def emitted_kinds() -> set[str]:
    root = Path(detectors_pkg.__file__).parent
    kinds = set()
    for source in root.rglob("*.py"):
        kinds |= set(re.findall(r'Candidate\(\s*"([a-z_]+)"', source.read_text(encoding="utf-8")))
    return kinds


def test_every_kind_a_detector_emits_has_an_alert() -> None:
    kinds = emitted_kinds()
    assert len(kinds) >= 6, kinds  # the grep still finds the detectors
    missing = kinds - set(KIND_TO_ALERT)
    assert not missing, f"finding kinds with no alert in gpumond.alerts.catalogue: {sorted(missing)}"
    for kind in kinds:
        assert ALERTS[KIND_TO_ALERT[kind]].source == "rules"


def test_every_finding_alert_is_emitted_by_some_detector() -> None:
    assert set(FINDING_KINDS) == emitted_kinds() == set(EXPECTED_ALERT)
