"""The rules service's step store at fleet scale, in process: RSS per held step, the cost of a push's decode and
store, and the evaluator's snapshot and expiry, for both push encodings.

Each size runs in a fresh child process (`--one RANKS STEPS`) so its RSS is its own: RANKS ranks (32 per job)
each pushed STEPS steps in pushes of 64 through `RankStore.record` with columns, then one snapshot
(`RankStore.jobs`, what the detectors read) after every rank pushed once more, then `expire`. RSS per held step
is (RSS after the fill − RSS before it) ÷ steps held, so it includes the per-rank objects and the allocator's
slack, not only the columns. Decode: `parse` of one 64-step push body of each encoding (the same steps),
CPU time per push over many, in the parent process.

    python benchmarks/rules_store.py            # ~2 min: 32,768 ranks × 512 steps (the default
                                                # limits.max_steps_held spread over them) and 4,096 × 2,048
    python benchmarks/rules_store.py --quick    # seconds (smoke test)
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _bench  # noqa: E402

PUSH = 64
TARGET_BYTES = 48


def one(ranks: int, steps: int) -> dict[str, float]:
    """Fill a RankStore in this process; what it cost."""
    import numpy as np
    import psutil

    from gpumond.rules.store import RankStore
    from gpumond.rules.types import RankInfo, StepColumns

    store = RankStore(window_s=1e9, expire_after_s=1e9, max_jobs=1 << 20, max_ranks=1 << 22, max_gpus=1 << 22,
                      max_steps_per_rank=steps, max_steps_held=ranks * steps)
    infos = [RankInfo(f"job-{r // 32}", r % 32, 32, f"node-{r // 8}", f"GPU-{r:08x}-0000-4000-8000-000000000000")
             for r in range(ranks)]
    me = psutil.Process()
    gc.collect()
    before = me.memory_info().rss
    now = time.time() - 1e6
    values = np.empty((4, PUSH))
    values[1], values[2], values[3] = 0.84, 0.02, 0.11
    cpu0 = time.process_time()
    pushes = 0
    for k in range(-(-steps // PUSH)):
        numbers = np.arange(k * PUSH, (k + 1) * PUSH, dtype=np.int64)
        values[0] = now + numbers
        batch = StepColumns(numbers, values.copy())
        for info in infos:
            store.record(info, batch, now + k)
            pushes += 1
    record_cpu = time.process_time() - cpu0
    gc.collect()
    held = store.counts().steps
    rss = me.memory_info().rss - before
    numbers = np.arange(10**6, 10**6 + PUSH, dtype=np.int64)
    values[0] = now + numbers
    batch = StepColumns(numbers, values.copy())
    for info in infos:  # every rank changed since the last snapshot: the evaluator's usual case
        store.record(info, batch, now + 10**6)
    t0 = time.perf_counter()
    snapshot = store.jobs(now + 10**6)
    snap_s = time.perf_counter() - t0
    assert sum(len(r) for r in snapshot.values()) == ranks
    t0 = time.perf_counter()
    store.expire(now + 10**6)
    expire_s = time.perf_counter() - t0
    return {"ranks": ranks, "steps_held": held, "rss_bytes": rss, "record_cpu_s": record_cpu, "pushes": pushes,
            "snapshot_s": snap_s, "expire_s": expire_s}


def decode_costs(repeat: int) -> dict[str, float]:
    """CPU seconds per `parse` of a 64-step push, by encoding."""
    from gpumond.config.rules import LimitsConfig
    from gpumond.job.payload import encode_head, encoder
    from gpumond.push.body import columns_model, parse, push_model

    limits = LimitsConfig()
    now = time.time()
    head = {"job": "job-1", "rank": 3, "world_size": 32, "node": "node-0",
            "gpu_uuid": "GPU-00000003-0000-4000-8000-000000000000"}
    # The SDK's own encoders: the bodies a rank sends, ends already on the unix clock (wall = monotonic here).
    records = [(1000 + i, now - (PUSH - i) * 0.5, 0.84, 0.02, 32, 0.11) for i in range(PUSH)]
    out = {}
    for encoding, model in (("json", push_model(limits.max_string_len, limits.max_steps_per_push)),
                            ("columns", columns_model(limits.max_string_len, limits.max_steps_per_push))):
        raw = encoder(encoding)(encode_head(head, encoding), records, 0.0, 0.0)
        parse(model, raw)
        t0 = time.process_time()
        for _ in range(repeat):
            parse(model, raw).step_columns()
        out[encoding] = (time.process_time() - t0) / repeat
        out[f"{encoding}_bytes"] = len(raw)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, seconds (smoke test)")
    ap.add_argument("--one", nargs=2, type=int, metavar=("RANKS", "STEPS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(*args.one)))
        return 0
    sizes = [(1024, 128)] if args.quick else [(32_768, 512), (4_096, 2_048)]
    runs = []
    for ranks, steps in sizes:
        out = subprocess.run([sys.executable, __file__, "--one", str(ranks), str(steps)], capture_output=True,
                             text=True, timeout=1200, check=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    dec = decode_costs(200 if args.quick else 3000)
    rows = []
    for r in runs:
        per = r["rss_bytes"] / r["steps_held"]
        rows.append([f"{r['ranks']:,}", f"{r['steps_held'] // r['ranks']:,}", f"{r['steps_held']:,}",
                     f"{r['rss_bytes'] / 2**20:,.0f} MiB", f"{per:.1f} B",
                     "yes" if per <= TARGET_BYTES else f"**no** (+{per / TARGET_BYTES - 1:.0%})",
                     f"{r['record_cpu_s'] / r['pushes'] * 1e6:.1f} µs",
                     f"{r['snapshot_s'] * 1e3:,.0f} ms", f"{r['expire_s'] * 1e3:,.0f} ms"])
    text = "\n".join([
        "# Rules store at fleet scale: RSS per held step, push decode, snapshot and expiry\n",
        _bench.machine_block({"setup": f"pushes of {PUSH} steps, 32 ranks per job; each size in a fresh process"}),
        "",
        "## Held steps\n",
        _bench.md_table(["ranks", "steps per rank", "steps held", "RSS for them", "RSS per held step",
                         f"≤ {TARGET_BYTES} B", "CPU per push stored", "snapshot (every rank changed)",
                         "expire"], rows),
        "",
        "RSS per held step = the process's RSS growth over the fill ÷ steps held: the columns (5 × 8 bytes a "
        "step plus a sixteenth of room) and everything per rank (its RankInfo, buffers' headers, dict entries) "
        "and the allocator's slack.",
        "",
        f"## Decoding one {PUSH}-step push (`parse`, CPU per push)\n",
        _bench.md_table(["encoding", "body", "CPU per push", "per step"], [
            [e, f"{dec[e + '_bytes']:,} B", f"{dec[e] * 1e6:,.0f} µs", f"{dec[e] / PUSH * 1e6:.2f} µs"]
            for e in ("json", "columns")]),
        "",
        f"Columnar decode is {dec['json'] / dec['columns']:.1f}× cheaper per push than JSON here (same steps; the "
        "machine is shared, the ratio is the comparable figure).",
    ])
    _bench.write_result("rules_store", text, quick=args.quick)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
