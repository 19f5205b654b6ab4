"""The detection benchmark's plan: `--seed` and `--only` pick runs of the full plan, each exactly as it runs there
(the same job size, duration and scenario seed), so one false finding can be chased alone."""

import pytest

from benchmarks.detection import run
from benchmarks.detection.scenarios import T0
from benchmarks.detection.score import Episode


def test_one_seed_and_one_control_are_that_run_of_the_full_plan():
    full = {sc.seed: sc for sc in run.plan(False, 3, big=False)}
    (sc,) = run.plan(False, 3, big=False, seed=0, only=("uneven sequence lengths",))
    assert (sc.name, sc.seed, sc.nodes, sc.duration_s) == ("control: uneven sequence lengths", 503, 64, 1800.0)
    assert sc == full[503]


def test_only_matches_every_seeds_runs_whose_name_holds_it_and_the_big_control_belongs_to_seed_0():
    picked = run.plan(False, 3, nodes=16, control_s=900.0, only=("slow_gpu 1.05", "1024-node"))
    assert sorted(sc.name for sc in picked) == ["control: 1024-node job, transient slowdowns",
                                                *["slow_gpu 1.05 silent"] * 3, *["slow_gpu 1.05 throttled"] * 3]
    assert [sc.name for sc in run.plan(False, 3, seed=1, only=("1024-node",))] == []


def test_a_partial_run_must_be_named_and_must_match_something(capsys):
    with pytest.raises(SystemExit) as e:
        run.main(["--seed", "0", "--only", "uneven"])
    assert e.value.code == 2 and "--out" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        run.main(["--only", "no such scenario", "--out", "detection_chase", "--no-big", "--no-scaling"])
    assert e.value.code == 2 and "no scenario of the plan matches" in capsys.readouterr().err


def test_a_false_finding_is_told_in_one_line_with_its_strongest_signal():
    ep = Episode("straggler", "job-0", "node-00013", 111, "GPU-00013-7", T0 + 441.0, T0 + 421.0, label="fp",
                 evidence={"threshold_z": 5.06, "signals": {"compute_share": {"z": 5.44, "look": "long"},
                                                            "power_ratio": {"z": -3.9}}})
    assert run.describe(ep) == ("straggler on rank 111 (node-00013) firing at 441 s: compute_share long z 5.44 "
                                "against 5.06")
    assert run.describe(Episode("io_starved_job", "job-0", None, None, None, T0 + 90.0, T0 + 70.0)) == \
        "io_starved_job on job-0 firing at 90 s"
