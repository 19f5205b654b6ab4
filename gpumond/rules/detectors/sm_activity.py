"""Pure: SM activity (GPM) as a straggler signal for ranks whose job pushes no collective wait.

In a synchronous step the slow rank computes while its peers spin inside the step's collectives. NVML's
utilization reads ~100 % on all of them (a spinning NCCL kernel is a kernel), but GPM's SM activity — the
share of SM cycles with a warp resident — is high while a GPU computes and low while it spins (NCCL's
kernels occupy only the SMs of their channels). So the straggler's SM activity stands out high against its
peers' over the same interval.

Over one agent interval (1 s) the reading depends on where in the step the interval fell, and agents on
different nodes sample at different moments: compared across nodes, a 4 s step's phase moves a GPU's
reading far more than a 10 % slowdown does. The GPUs of one node are read in the same interval, so each
reading is taken relative to the median of its node's readings at that instant: the step's phase, the
job's kernel mix and a heavier pipeline stage (whole nodes in this codebase's node-aligned stages) move a
node's GPUs together and cancel. What is left is each GPU's own deviation, averaged over the window with
the highest and lowest `trim` of the instants cut off, so that a transient of a few seconds (one or two
readings) does not carry it. A whole node slowed together is invisible here (its median moves with it);
the other signals and the straggler-node rule still see it.

Present only where the agents export `sm_active` (Hopper and later): elsewhere nothing is returned and the
detectors judge on the other signals, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from gpumond.rules.detectors.ragged import trim_counts
from gpumond.rules.types import GpuSample

KEY = "sm_active"


def node_relative(gpu_windows: Mapping[str, Sequence[GpuSample]], node_of: Mapping[str, str], since: float,
                  min_gpus: int, min_instants: int, trim: float) -> dict[str, float]:
    """uuid → trimmed mean over the window of (its SM activity − its node's median at the same instant).

    `node_of` is uuid → node of the GPUs to judge (MIG devices are left out: slices of different sizes are
    no peers). An instant counts where at least `min_gpus` of a node's GPUs have a reading; a GPU needs
    `min_instants` such instants. The trim is features.trimmed_mean's: trim_count(n, trim) off each end.
    All of a job's readings at once (numpy): per-instant Python medians cost ~100 µs a GPU."""
    uuids = [u for u in node_of if not u.startswith("MIG-")]
    node_ids = {n: i for i, n in enumerate(dict.fromkeys(node_of[u] for u in uuids))}
    gpu, node, t, v = [], [], [], []
    for i, uuid in enumerate(uuids):
        k = node_ids[node_of[uuid]]
        for s in gpu_windows.get(uuid, ()):
            if s.up and s.t >= since and (x := s.values.get(KEY)) is not None:
                gpu.append(i), node.append(k), t.append(s.t), v.append(x)
    if not v:
        return {}
    g, n, tt, x = np.array(gpu), np.array(node), np.array(t, dtype=float), np.array(v, dtype=float)
    # Instants: (node, t) groups, each sorted by value, so a group's median sits at its middle.
    order = np.lexsort((x, tt, n))
    g, n, tt, x = g[order], n[order], tt[order], x[order]
    new = np.ones(len(x), dtype=bool)
    new[1:] = (n[1:] != n[:-1]) | (tt[1:] != tt[:-1])
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, len(x)))
    med = 0.5 * (x[starts + (counts - 1) // 2] + x[starts + counts // 2])
    group = np.cumsum(new) - 1
    ok = counts[group] >= min_gpus
    g, dev = g[ok], (x - med[group])[ok]
    if not len(dev):
        return {}
    # Per GPU: its deviations sorted, the trimmed middle summed from a running sum.
    order = np.lexsort((dev, g))
    g, dev = g[order], dev[order]
    first = np.flatnonzero(np.append(True, g[1:] != g[:-1]))
    m = np.diff(np.append(first, len(g)))
    cut = trim_counts(m, trim)
    csum = np.append(0.0, np.cumsum(dev))
    mean = (csum[first + m - cut] - csum[first + cut]) / np.maximum(m - 2 * cut, 1)
    return {uuids[int(i)]: float(val) for i, val, k in zip(g[first], mean, m) if k >= min_instants}
