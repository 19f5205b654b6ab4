"""What a large config costs the agent: loading an agent config with a big `power_limit.per_gpu` table, the policy's
per-cycle lookup of 8 GPUs' settings in it, and loading a simulator scenario with many faults, by file size.

An operator's fleet-wide per_gpu table of UUIDs is the largest real config (~52 bytes a GPU); a scenario file is a
developer's. Each case runs in a fresh process (load CPU, peak RSS of the whole process, the lookup's CPU per
cycle). With `--before DIR` the same runs use DIR's gpumond too (e.g. `git archive REV gpumond | tar -x -C DIR`),
alternating with this tree's: a before/after in one run. Files past the loader's bound (config.load.MAX_FILE_BYTES)
and scenarios past nvml.sim.scenario.MAX_FAULTS are refused by this tree; the largest cases sit at them.

    python benchmarks/config_size.py --before /tmp/before     # ~2 min
    python benchmarks/config_size.py --quick                  # seconds (smoke test)
"""

from __future__ import annotations

import json
import random
import resource
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

AGENT, SCENARIO = 0, 1
# The largest of each kind sits at this tree's bounds: the loader's 4 MiB, a scenario's MAX_FAULTS.
FULL = [(AGENT, 1_000), (AGENT, 34_000), (AGENT, 78_000), (SCENARIO, 1_000), (SCENARIO, 10_000)]
QUICK = [(AGENT, 2_000), (SCENARIO, 2_000)]
CYCLES = 5  # policy cycles timed per case (the before tree's scan of a large table takes a second each)


def write(kind: int, n: int, directory: Path) -> Path:
    """An agent config with `n` per_gpu UUID entries, or a scenario with `n` XID faults."""
    rng = random.Random(n)
    if kind == AGENT:
        lines = ["policy:", "  power_limit:", "    per_gpu:"]
        lines += [f"      GPU-{uuid.UUID(int=rng.getrandbits(128))}: 400" for _ in range(n)]
    else:
        lines = ["faults:"] + [f"  - {{gpu: {i % 8}, kind: xid, code: 48, at_s: {i}}}" for i in range(n)]
    path = directory / f"{'agent' if kind == AGENT else 'scenario'}-{n}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def one(kind: int, n: int, path: str) -> dict:
    """In this (fresh) process: load the file, then for an agent config time the policy's lookup per cycle."""
    t = time.process_time()
    if kind == AGENT:
        from gpumond.agent.policy.limits import select_setting
        from gpumond.config import load_agent_config

        cfg = load_agent_config(path)
    else:
        from gpumond.nvml.sim import load_scenario

        load_scenario(path)
    load_s = time.process_time() - t
    cycle_s = None
    if kind == AGENT:
        class View:  # what select_setting reads of a GPU: none of these is in the table (a full lookup)
            def __init__(self, i: int) -> None:
                self.uuid, self.index, self.name = f"GPU-{uuid.UUID(int=i)}", i, "NVIDIA H100 80GB HBM3"

        views = [View(i) for i in range(8)]
        t = time.process_time()
        for _ in range(CYCLES):
            for v in views:
                select_setting(v, cfg.policy.power_limit)  # type: ignore[arg-type]
        cycle_s = (time.process_time() - t) / CYCLES
    return {"load_s": load_s, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "cycle_s": cycle_s}


def main() -> int:
    ap = _bench.parser(__doc__, "two small files")
    _bench.before_after_args(ap, "load")
    ap.add_argument("--path", help=__import__("argparse").SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], args.path)))
        return 0
    cases = QUICK if args.quick else FULL
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, n in cases:
            path = write(kind, n, Path(tmp))
            got: dict[str, list[dict]] = {}
            for label, tree in _bench.alternating(args, 1 if args.quick else args.rounds):
                got.setdefault(label, []).append(
                    _bench.one_in_fresh_process(__file__, tree, kind, n, 0, "--path", str(path)))
            size = path.stat().st_size / 2**20
            what = f"agent config, {n:,} per_gpu entries" if kind == AGENT else f"scenario, {n:,} faults"
            for label, runs in got.items():
                best = min(runs, key=lambda r: r["load_s"])
                cycle = "" if best["cycle_s"] is None else _bench.fmt_us(best["cycle_s"])
                rows.append((what, f"{size:.2f} MiB", label, f"{best['load_s']:.2f} s", f"{best['rss_mib']:.0f} MiB",
                             cycle))
    table = _bench.md_table(("file", "size", "gpumond", "load CPU (least)", "peak RSS", "policy lookup per cycle "
                             "(8 GPUs)"), rows)
    _bench.report("config_size", "# Large configs: load and per-cycle cost by file size",
                  {"command": " ".join(["python benchmarks/config_size.py", *sys.argv[1:]])}, table,
                  quick=args.quick)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
