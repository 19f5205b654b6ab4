"""GPM activity and NVLink evidence on one job's findings (activity.with_activity_many) at 32,768 GPUs.

Each evaluation adds the evidence to every job that has a finding; a per-GPU finding (straggler, starved rank)
needs the GPM activity of all the job's GPUs, for its peers' median. Measured on windows built as the service
builds them (a GpuStore fed 13 fetches at the 5 s scrape cadence, read with the 60 s recent window), with 9
findings (8 stragglers and a straggler node), without GPM (agents before Hopper, the usual case) and with it on
every sample. With `--before DIR` the same runs from DIR's gpumond too (e.g. `git archive REV gpumond | tar -x -C
DIR`), alternating with this tree's in separate processes: a before/after in one run.

    python benchmarks/activity_evidence.py --before /tmp/before     # ~2 min
    python benchmarks/activity_evidence.py --quick                  # seconds (smoke test)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

GPUS_PER_NODE = 8
SCRAPE_S = 5.0
FETCHES = 13  # 60 s of samples at 5 s: the whole recent window
THROTTLE = ("throttle_hw_thermal", "throttle_sw_thermal", "throttle_hw_slowdown", "throttle_sw_power_cap",
            "throttle_hw_power_brake")


def measure(gpus: int, gpm: bool, repeats: int) -> dict:
    """Least and median CPU of `repeats` with_activity_many calls on one job of `gpus` GPUs."""
    from gpumond.rules.detectors.activity import with_activity_many
    from gpumond.rules.detectors.candidate import Candidate
    from gpumond.rules.store import GpuStore
    from gpumond.rules.types import GpuSample, TelemetryBatch

    uuids = [f"GPU-{i:06d}" for i in range(gpus)]
    nodes = [f"node-{i // GPUS_PER_NODE:05d}" for i in range(gpus)]
    store = GpuStore(window_s=300.0, expire_after_s=600.0, max_gpus=gpus, max_samples=64)
    now = 0.0
    for f in range(FETCHES):
        now = f * SCRAPE_S
        samples = []
        for i, (u, node) in enumerate(zip(uuids, nodes, strict=True)):
            v = {"sm_clock_hz": 1.98e9 * (1 + 0.002 * ((i + f) % 5)), "sm_clock_max_hz": 1.98e9,
                 "power_w": 650.0 + (i * 7 + f) % 11, "power_limit_w": 700.0, "utilization": 0.99,
                 "temperature_c": 60.0 + i % 9, "energy_j": 650.0 * now, **dict.fromkeys(THROTTLE, 0.0),
                 "nvlink_replays_total": 3.0}
            if gpm:
                v["sm_active"] = 0.6 + 0.01 * ((i + f) % 13)
                v["tensor_active"] = 0.3 + 0.01 * ((i * 3 + f) % 7)
            samples.append(GpuSample(u, node, str(i % GPUS_PER_NODE), now, True, v))
        store.add(TelemetryBatch(now, tuple(samples)))
    since = now - 60.0
    windows = store.windows(uuids, since)  # as the evaluator reads them, once an evaluation
    job_gpus = dict(zip(uuids, nodes, strict=True))
    picked = [i * (gpus // 8) + 3 for i in range(8)]
    candidates = [Candidate("straggler", "j", nodes[i], i, uuids[i], 5.0, {}) for i in picked]
    candidates.append(Candidate("straggler_node", "j", nodes[gpus // 2], None, None, 5.0, {}))
    cpu, evidence = [], None
    for _ in range(repeats):
        t = time.process_time()
        out = with_activity_many(candidates, windows, job_gpus, since)
        cpu.append(time.process_time() - t)
        evidence = [c.evidence for c in out]
    cpu.sort()
    return {"min": cpu[0], "median": cpu[len(cpu) // 2], "evidence": repr(evidence)}


def _run(tree: Path | None, gpus: int, gpm: bool, repeats: int) -> dict:
    """One measurement in a fresh process, importing gpumond from `tree` (None: this checkout)."""
    return _bench.one_in_fresh_process(__file__, tree, gpus, int(gpm), repeats)


def main() -> None:
    ap = _bench.parser(__doc__, "512 GPUs")
    _bench.before_after_args(ap, "run")
    args = ap.parse_args()
    if args.one:
        gpus, gpm, repeats = args.one
        print(json.dumps(measure(gpus, bool(gpm), repeats)))
        return
    gpus, repeats = (512, 2) if args.quick else (32_768, 5)
    rounds = 1 if args.quick else args.rounds
    rows = []
    for gpm in (False, True):
        case = "GPM on every sample" if gpm else "no GPM (before Hopper)"
        got: dict[str, list[float]] = {"this tree": [], "before": []}
        evidence: dict[str, str] = {}
        for label, tree in _bench.alternating(args, rounds):
            one = _run(tree, gpus, gpm, repeats)
            got[label].append(one["min"])
            evidence[label] = one["evidence"]
            print(f"[{case}] {label}: {got[label][-1] * 1e3:.1f} ms", file=sys.stderr, flush=True)
        if len(set(evidence.values())) != 1:
            raise SystemExit(f"{case}: the evidence differs between the trees")
        now = min(got["this tree"])
        row = [case, f"{gpus:,}", f"{now * 1e3:.1f} ms"]
        if args.before:
            before = min(got["before"])
            row += [f"{before * 1e3:.1f} ms", f"{now / before:.3f}"]
        rows.append(row)
    headers = ["telemetry", "GPUs in the job", *_bench.before_after_headers(args, "CPU per call, this tree (least)")]
    text = "\n".join([
        "# GPM and NVLink evidence on one job's 9 findings (activity.with_activity_many)", "",
        _bench.machine_block({"rounds": f"{rounds} alternating, {repeats} calls each (least CPU kept)"}), "",
        _bench.md_table(headers, rows), "",
        f"One job of {gpus:,} GPUs, its windows read from a GpuStore as the evaluator reads them ({FETCHES} "
        f"fetches {SCRAPE_S:g} s apart, the 60 s recent window), 8 straggler findings and a straggler-node one. "
        "The evidence each tree gave is checked equal. Each figure is the least process CPU of the calls in a "
        "fresh process; the machine is shared, so compare within a row."])
    _bench.write_result("activity_evidence", text, quick=args.quick)


if __name__ == "__main__":
    main()
