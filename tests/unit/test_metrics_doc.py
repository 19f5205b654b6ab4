from pathlib import Path

from gpumond.agent.metrics_doc import render


def test_docs_metrics_md_is_current():
    doc = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
    assert doc.read_text() == render(), "regenerate: python -m gpumond.agent.metrics_doc > docs/metrics.md"
