"""What a healthy fleet looks like: workload noise, telemetry noise and silicon variation.

Every number here is a modelling choice explained in docs/detection-benchmark.md. The negative
controls of the benchmark are this model with one knob turned up (`Noise.replace(...)`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

# NVML-like constants of an H100 SXM board (the shape matters, not the brand).
POWER_LIMIT_W = 700.0
SM_CLOCK_MAX_HZ = 1.98e9
CLOCK_STEP_HZ = 15e6  # SM clocks move in 15 MHz bins
IDLE_CLOCK_HZ = 345e6  # after ~2 s without kernels the SM clock drops to idle
SLOT_TEMP_OFFSET_C = (0.0, 1.0, 3.0, 5.0, 5.5, 3.5, 1.5, 0.5)  # middle slots sit downstream of hot air


@dataclass(frozen=True, slots=True)
class Noise:
    """Knobs of the healthy-fleet model. Defaults are the 'everyday' fleet every scenario runs on."""

    # --- workload (per rank, per step) ---
    jitter_sigma: float = 0.015  # heavy-tailed (Student-t, 3 dof) kernel/launch jitter, relative
    seq_sigma: float = 0.04  # uneven sequence lengths: lognormal compute factor per rank per step
    long_seq_p: float = 0.0  # chance a rank draws a batch of long sequences in a step…
    long_seq_factor: float = 1.6  # …that costs this much more compute
    common_sigma: float = 0.01  # per-step factor shared by every rank (network, input mix)
    comm_frac: float = 0.12  # exposed collective time per step, relative to base compute
    loader_wait_frac: float = 0.002  # a healthy, prefetching loader: ~ms per step
    hiccup_p: float = 0.002  # a rank's loader occasionally misses its prefetch…
    hiccup_frac: tuple[float, float] = (0.05, 0.3)  # …and waits this fraction of a step
    gc_p: float = 5e-4  # chance per rank per step of a Python GC pause
    gc_median_s: float = 0.3
    # Transient slowness: a healthy rank computes 1.15–1.6× slower for a while — a preempted CPU
    # thread, a GC-heavy stretch, a noisy neighbour on its host. Wall-time episodes, so their size in steps
    # depends on the step time. Off in the everyday fleet (0 per hour, no draws: the other scenarios keep
    # their random streams); the transient controls turn them on. See docs/detection-benchmark.md.
    transient_rate_h: float = 0.0  # episodes per rank-hour on one rank…
    transient_node_rate_h: float = 0.0  # …and per node-hour on all 8 ranks of a node (host contention)
    transient_median_s: float = 0.5  # duration: lognormal with this median…
    transient_node_median_s: float = 2.0  # (node episodes)
    transient_sigma: float = 1.0  # …and log-sd…
    transient_max_s: float = 6.0  # …capped here: longer slowness is a slowdown the detectors may report
    transient_factor: tuple[float, float] = (1.15, 1.6)  # compute × uniform in this range
    ckpt_every_s: float = 1800.0  # synchronous checkpoint every this many seconds (0: none)
    ckpt_s: tuple[float, float] = (20.0, 60.0)  # its duration, all ranks together
    # --- telemetry ---
    sample_miss_p: float = 0.02  # a GPU's sample absent from a scrape
    node_miss_p: float = 0.005  # a whole node's scrape failed (its GPUs and host sample absent)
    power_meas_sigma: float = 0.008  # relative noise of one ~1 s power reading
    util_meas_sigma: float = 0.01
    temp_meas_sigma: float = 0.4
    # GPM (Hopper and later; `Cluster(gpm=...)` says which nodes have it): SM activity over the agent's 1 s
    # interval is the share of SM cycles with a warp resident. Compute kernels keep most SMs busy; NCCL's
    # spinning collective kernels occupy only the SMs of their channels (16–32 of 132 on an H100). Per job,
    # uniform in these ranges (the model's kernels decide them); idle reads 0.
    sm_active_compute: tuple[float, float] = (0.75, 0.92)
    sm_active_spin: tuple[float, float] = (0.08, 0.20)
    tensor_per_sm: tuple[float, float] = (0.45, 0.7)  # tensor-pipe activity per unit of compute SM activity
    gpm_meas_sigma: float = 0.01  # relative noise of one 1 s GPM reading
    power_cap_event_p: float = 0.03  # healthy GPUs brush against the power cap (sw_power_cap bit)
    sw_thermal_event_p: float = 0.001  # and rarely a brief sw thermal slowdown bit
    # --- silicon and cooling (per GPU, fixed for the run) ---
    silicon_power_sigma: float = 0.012  # same work, different power: ±2–3 % (clipped at 3 %)
    thermal_r_c_per_w: float = 0.055  # °C per W above inlet
    thermal_r_sigma: float = 0.05
    node_ambient_sigma_c: float = 1.5
    # --- power levels, fraction of the limit ---
    p_compute: float = 0.90
    p_spin: tuple[float, float] = (0.45, 0.55)  # NCCL kernels spinning in a collective (per job)
    p_idle: float = 0.12

    def with_(self, **kw: object) -> Noise:
        """A copy with some knobs changed."""
        return replace(self, **kw)  # type: ignore[arg-type]


def heavy_tail(rng: np.random.Generator, n: int, sigma: float) -> np.ndarray:
    """Multiplicative jitter 1 + sigma·t₃/√3 (unit variance before scaling), floored so it stays positive."""
    return np.maximum(1.0 + sigma * rng.standard_t(3, n) / np.sqrt(3.0), 0.5)


def compute_factor(rng: np.random.Generator, n: int, noise: Noise) -> np.ndarray:
    """Per-rank compute multiplier for one step: sequence-length imbalance × kernel jitter."""
    f = np.exp(noise.seq_sigma * rng.standard_normal(n)) * heavy_tail(rng, n, noise.jitter_sigma)
    if noise.long_seq_p > 0:
        f = np.where(rng.random(n) < noise.long_seq_p, f * noise.long_seq_factor, f)
    return f


def loader_wait(rng: np.random.Generator, n: int, step_s: float, noise: Noise) -> np.ndarray:
    """A healthy rank's data-loader wait in one step (seconds): ~0, with rare missed prefetches."""
    w = step_s * noise.loader_wait_frac * rng.lognormal(0.0, 0.5, n)
    hic = rng.random(n) < noise.hiccup_p
    if hic.any():
        lo, hi = noise.hiccup_frac
        w = np.where(hic, w + step_s * rng.uniform(lo, hi, n), w)
    return w


def gc_pauses(rng: np.random.Generator, n: int, noise: Noise) -> np.ndarray:
    """Seconds each rank's host thread is stopped by a GC pause this step (mostly 0)."""
    hit = rng.random(n) < noise.gc_p
    if not hit.any():
        return np.zeros(n)
    return np.where(hit, noise.gc_median_s * rng.lognormal(0.0, 0.5, n), 0.0)


def transient_episodes(rng: np.random.Generator, units: int, rate_h: float, dt: float, median_s: float,
                       noise: Noise) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """New transient episodes among `units` (ranks or nodes) over `dt` seconds: (unit, duration s, factor)."""
    k = int(rng.poisson(rate_h * units * dt / 3600.0)) if rate_h > 0 and dt > 0 else 0
    if k == 0:
        return np.empty(0, dtype=np.int64), np.empty(0), np.empty(0)
    who = rng.integers(0, units, k)
    dur = np.minimum(median_s * rng.lognormal(0.0, noise.transient_sigma, k), noise.transient_max_s)
    return who, dur, rng.uniform(*noise.transient_factor, k)


def silicon(rng: np.random.Generator, n_gpus: int, noise: Noise) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-GPU (power factor, thermal resistance °C/W, temperature offset °C from slot and node)."""
    pf = 1.0 + np.clip(noise.silicon_power_sigma * rng.standard_normal(n_gpus), -0.03, 0.03)
    r = noise.thermal_r_c_per_w * (1.0 + noise.thermal_r_sigma * rng.standard_normal(n_gpus))
    nodes = (n_gpus + 7) // 8
    ambient = 25.0 + noise.node_ambient_sigma_c * rng.standard_normal(nodes)
    slot = np.array(SLOT_TEMP_OFFSET_C)[np.arange(n_gpus) % 8]
    off = ambient[np.arange(n_gpus) // 8] + slot + 0.7 * rng.standard_normal(n_gpus)
    return pf, r, off
