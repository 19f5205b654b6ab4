"""The rules service's /metrics, with a firing finding in it, passes `promtool check metrics` silently."""

import pytest

from gpumond.config.rules import RulesConfig
from gpumond.rules.service import RulesService
from gpumond.rules.types import RankInfo, StepRecord
from tests.integration import helpers

pytestmark = pytest.mark.integration


def test_rules_metrics_with_findings_are_lint_clean(tmp_path):
    now = [10_000.0]
    cfg = RulesConfig.model_validate({"tokens": ["t" * 32], "evaluation_interval_s": 1, "state_dir": str(tmp_path),
                                      "findings": {"min_duration_s": 1}})  # fires on the second evaluation
    service = RulesService(cfg, clock=lambda: now[0])
    for step in range(60):
        for rank in range(8):
            info = RankInfo("job-a", rank, 8, f"node-{rank // 4}", f"GPU-{rank:08d}-0000-0000-0000-000000000000")
            wait = 0.3 if rank == 5 else 0.001  # rank 5's data loader starves
            service.ranks.add(info, [StepRecord(step, now[0] - 60 + step, 1.0, wait)], now[0])
    for _ in range(3):  # 0, 5 and 10 s: seen in 3 of 3 evaluations, held longer than findings.min_duration_s
        service.evaluator.evaluate()
        now[0] += 5
    firing = [f for f in service.evaluator.findings() if f.state == "firing"]
    assert [(f.kind, f.rank) for f in firing] == [("io_starved_rank", 5)]
    text = service.metrics()
    assert b'gpumond_finding{gpu_uuid="GPU-00000005' in text
    assert b'gpumond_http_connections_closed_total{reason="shed"} 0' in text  # the server's own counters
    rc, out = helpers.promtool_check_metrics(text)
    assert (rc, out) == (0, ""), out
