"""One training rank for the relay tests: steps at a fixed rate for a while through gpumond.job, then closes and
prints its counters as one JSON line. Its route (GPUMOND_RELAY, GPUMOND_ENDPOINT, token, GPU) is the environment's.

python relay_rank.py RANK WORLD SECONDS STEPS_PER_S
"""

from __future__ import annotations

import json
import sys
import time

from gpumond import job


def main() -> None:
    rank, world, seconds, rate = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    rep = job.init(rank=rank, world_size=world, push_interval_s=1.0, handle_sigterm=False)
    start = time.monotonic()
    n = 0
    while (now := time.monotonic()) - start < seconds:
        with rep.step():
            time.sleep(0.005)
        n += 1
        time.sleep(max(0.0, start + n / rate - time.monotonic()))
    rep.close(timeout_s=30.0)
    stats = rep.stats
    print(json.dumps({"recorded": n, "pushed": stats.pushed_steps, "dropped": stats.dropped_steps,
                      "by_service": dict(stats.dropped_by_service), "queued": stats.queue_len,
                      "error": stats.last_error, "enabled": rep.enabled}), flush=True)


if __name__ == "__main__":
    main()
