"""Before/after harness for detector changes: the same fault scenarios and fault-free runs, one summary.

    PYTHONPATH=/path/to/patched-copy:/path/to/this/repo python benchmarks/detection/experiment.py NAME 0,1

Run it as a script (not `-m` from the repo root, where the repo's own gpumond would shadow the copy).
Seeds are comma-separated; each seed runs every fault scenario on a 32-node job and the seven negative
controls (32 nodes, 15 min each), with the energy counter emitted. Used for the variant table in
docs/detection-benchmark.md.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repo, after any patched copy on PYTHONPATH

import gpumond  # noqa: E402

from benchmarks.detection import metrics as M  # noqa: E402
from benchmarks.detection import scenarios as S  # noqa: E402
from benchmarks.detection import score  # noqa: E402


def _one(sc: S.Scenario) -> score.RunResult:
    return score.run(sc, energy=True)


def main() -> None:
    name, seeds = sys.argv[1], [int(x) for x in sys.argv[2].split(",")]
    scs = []
    for s in seeds:
        scs += S.fault_scenarios(s, 32)
        scs += S.control_scenarios(s, 32, 900.0)
    with mp.get_context("fork").Pool(2) as pool:
        res = list(pool.imap_unordered(_one, scs))
    faults = [r for r in res if r.scenario.kind == "fault"]
    out: dict[str, object] = {}
    for s in S.SLOWDOWNS:
        for vis in (True, False):
            r = M.row("", faults, lambda tr, s=s, vis=vis: tr.fault.kind == "slow_gpu" and tr.fault.slowdown == s
                      and tr.fault.visible == vis)
            out[f"gpu {s} {'T' if vis else 'S'}"] = (r.recall, r.precision, r.p(50))
    for vis in (True, False):
        r = M.row("", faults, lambda tr, vis=vis: tr.fault.kind == "slow_node" and tr.fault.visible == vis)
        out[f"node {'T' if vis else 'S'}"] = (r.recall, r.precision, r.p(50))
    for k in ("starved_rank", "starved_node", "starved_job", "hung_rank"):
        r = M.row("", faults, lambda tr, k=k: tr.fault.kind == k)
        out[k] = (r.recall, r.precision, r.p(50))
    hang = M.row("", faults, lambda tr: tr.fault.kind == "hung_rank")
    out["hung lat p50/p90"] = (hang.p(50), hang.p(90))
    sl = M.row("", faults, lambda tr: tr.fault.kind in ("slow_gpu", "slow_node") and tr.fault.slowdown >= 1.25)
    out["lat>=1.25 p50/p90"] = (sl.p(50), sl.p(90))
    mix = M.mixed(res, exclude=lambda tr: tr.fault.kind == "slow_gpu" and tr.fault.slowdown < 1.04)
    out["mixed P/R/F1"] = (mix.precision, mix.recall, mix.f1)
    for d in M.false_alarms([r for r in res if r.scenario.kind == "control"]):
        out["FA " + d["control"]] = dict(d["false"])
    print(f"{name} (detectors from {Path(gpumond.__file__).parent})")
    for k, v in out.items():
        print(f"  {k:32s} {v}")
    ok, n = M.told_apart(faults)
    print("  told apart", ok, n)


if __name__ == "__main__":
    main()
