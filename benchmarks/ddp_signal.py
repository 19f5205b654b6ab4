"""How well does DDP's collective wait, as gpumond.job.torch measures it, localise a slow or starved rank?

Runs benchmarks/ddp_job.py under torchrun (4 ranks, gloo on CPU) once per scenario: no fault; rank 2
slowed 1.05/1.10/1.25/1.5× (emulated device time, the host blocking as on a GPU); the same with one
bucket instead of several (does overlapping the all-reduce with backward hide the skew?) and with real
CPU work instead (4 ranks time-sharing 2 cores); rank 1's loader starved; every loader starved. For each
rank: the median comm_wait_s it pushed (exposed wait) and the sum of bucket waits, the median data wait,
and the step-to-step noise; per scenario, the separation (median of the other ranks' median wait minus
the faulty rank's) and how often, step by step, the faulty rank is the one that waited least.

    python benchmarks/ddp_signal.py [--quick] [--steps N]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

HERE = Path(__file__).resolve().parent
WORLD = 4
# via=hook: this benchmark compares the exposed wait with the per-bucket sum, which only the comm hook
# measures (instrument()'s default, via="backward", measures the same exposed wait without the hook).
BASE = ["--batch", "32", "--dim", "64", "--width", "256", "--depth", "4", "--device-ms", "30", "--via", "hook"]
MULTI = ["--bucket-mb", "0.1"]  # 4 buckets for this model
ONE = ["--bucket-mb", "25"]  # DDP's default: the whole model in one bucket

# (name, faulty rank or None, args, kind)
SCENARIOS = [
    ("no fault", None, MULTI, "slow"),
    *[(f"rank 2 slowed {f}×", 2, [*MULTI, "--slow-rank", "2", "--slow-factor", str(f)], "slow")
      for f in (1.05, 1.10, 1.25, 1.5)],
    ("one bucket, no fault", None, ONE, "slow"),
    ("one bucket, rank 2 slowed 1.10×", 2, [*ONE, "--slow-rank", "2", "--slow-factor", "1.1"], "slow"),
    ("one bucket, rank 2 slowed 1.25×", 2, [*ONE, "--slow-rank", "2", "--slow-factor", "1.25"], "slow"),
    ("CPU work, rank 2 slowed 1.25×", 2, [*MULTI, "--slow-rank", "2", "--slow-factor", "1.25", "--slow-mode", "cpu"],
     "slow"),
    ("CPU work, rank 2 slowed 1.5×", 2, [*MULTI, "--slow-rank", "2", "--slow-factor", "1.5", "--slow-mode", "cpu"],
     "slow"),
    ("rank 1's loader starved (+10 ms/batch)", 1, [*MULTI, "--starve-rank", "1", "--starve-s", "0.01"], "starve"),
    ("every loader starved (+10 ms/batch)", None, [*MULTI, "--starve-all", "--starve-s", "0.01"], "starve"),
]


# --quick: 2 ranks, one fault, a few steps of a lighter step: it proves the harness runs, in seconds.
QUICK = ("rank 1 slowed 1.5×", 1, [*MULTI, "--slow-rank", "1", "--slow-factor", "1.5", "--device-ms", "5"], "slow")


def run(args: list[str], steps: int, world: int = WORLD, warmup: int = 10) -> dict[int, dict[str, list[float]]]:
    """One torchrun; per rank the per-step series."""
    with tempfile.TemporaryDirectory() as tmp:
        _bench.torchrun(HERE / "ddp_job.py", world,
                        ["--steps", str(steps), "--warmup", str(warmup), "--out", tmp, *BASE, *args], timeout_s=600)
        series: dict[int, dict[str, list[float]]] = {}
        for r in range(world):
            hooks = [json.loads(x) for x in Path(tmp, f"rank{r}.jsonl").read_text().splitlines()]
            pushes = [json.loads(x) for x in Path(tmp, f"rank{r}.pushes.jsonl").read_text().splitlines()]
            pushes = pushes[warmup:]
            series[r] = {
                "exposed": [h["exposed_s"] for h in hooks if h["kind"] == "hook"],
                "buckets": [h["buckets_s"] for h in hooks if h["kind"] == "hook"],
                "nbuckets": [h["buckets"] for h in hooks if h["kind"] == "hook"],
                "comm": [p["comm_wait_s"] for p in pushes if p.get("comm_wait_s") is not None],
                "data": [p["data_wait_s"] for p in pushes],
                "duration": [p["duration_s"] for p in pushes],
            }
        return series


def ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def summarise(name: str, faulty: int | None, s: dict[int, dict[str, list[float]]]) -> list[object]:
    med = {r: statistics.median(v["comm"]) for r, v in s.items()}
    bmed = {r: statistics.median(v["buckets"]) for r, v in s.items()}
    data = {r: statistics.median(v["data"]) for r, v in s.items()}
    dur = statistics.median(x for v in s.values() for x in v["duration"])
    # Noise: the healthy ranks' step-to-step spread (p90 - p10) of the exposed wait.
    healthy = [r for r in s if r != faulty]
    noise = statistics.median(_bench.quantile(s[r]["comm"], 0.9) - _bench.quantile(s[r]["comm"], 0.1)
                              for r in healthy)
    bnoise = statistics.median(_bench.quantile(s[r]["buckets"], 0.9) - _bench.quantile(s[r]["buckets"], 0.1)
                               for r in healthy)
    if faulty is None:
        sep = bsep = hit = bhit = "—"
    else:
        others = statistics.median(med[r] for r in healthy)
        sep = f"{(others - med[faulty]) * 1e3:+.1f}"
        bsep = f"{(statistics.median(bmed[r] for r in healthy) - bmed[faulty]) * 1e3:+.1f}"
        n = min(len(v["comm"]) for v in s.values())
        wins = sum(1 for i in range(n) if min(s, key=lambda r: s[r]["comm"][i]) == faulty)
        hit = f"{100 * wins / n:.0f} %"
        nb = min(len(v["buckets"]) for v in s.values())
        bwins = sum(1 for i in range(nb) if min(s, key=lambda r: s[r]["buckets"][i]) == faulty)
        bhit = f"{100 * bwins / nb:.0f} %"
    return [name, ms(dur), " / ".join(ms(med[r]) for r in s), sep, hit, ms(noise),
            " / ".join(ms(bmed[r]) for r in s), bsep, bhit, ms(bnoise), " / ".join(ms(data[r]) for r in s),
            max(max(v["nbuckets"]) for v in s.values())]


def main() -> int:
    ap = _bench.parser(__doc__, "2 ranks, one slowed rank, 6 steps")
    ap.add_argument("--steps", type=int, default=150)
    a = ap.parse_args()
    scenarios = [QUICK] if a.quick else SCENARIOS
    steps, world, warmup = (6, 2, 2) if a.quick else (a.steps, WORLD, 10)
    rows = []
    for name, faulty, args, _kind in scenarios:
        print(f"… {name}", file=sys.stderr, flush=True)
        rows.append(summarise(name, faulty, run(args, steps, world, warmup)))
    ranks = "/".join(str(r) for r in range(world))
    head = ["scenario", "step ms", f"comm_wait_s (exposed) median ms, ranks {ranks}", "separation ms",
            "steps where the faulty rank waits least", "noise ms (healthy p90−p10)",
            f"Σ bucket waits median ms, ranks {ranks}", "Σ separation ms",
            "Σ: steps where the faulty rank waits least", "Σ noise ms", f"data wait median ms, ranks {ranks}",
            "buckets"]
    _bench.report(
        "ddp_signal", "# Collective wait on real DDP: does it localise a slow rank?",
        {"torch": _bench._version("torch"),
         "job": f"{world} ranks, torchrun, gloo on CPU, one intra-op thread each; MLP "
                f"64→256×4→10, batch 32, {steps} timed steps after {warmup} warm-up steps; "
                f"{5 if a.quick else 30} ms of emulated device time per step (the host sleeps inside the "
                "layers' forward and backward hooks, as it blocks on a GPU)",
         "note": "a shared 2-core VM with other work running: absolute times are "
                 "inflated and noisy; compare within a table"},
        _bench.md_table(head, rows),
        "*separation*: median over the healthy ranks of their median wait, minus the faulty rank's "
        "(positive: the faulty rank waits least). *exposed*: last bucket's launch → last completion, "
        "what gpumond pushes. *Σ bucket waits*: each bucket's launch → completion, summed (overlapping).",
        quick=a.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
