"""Detector thresholds: defaults chosen from the signal physics and tuned on benchmarks/detection."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    """Every threshold the detectors use; see docs/detectors.md for why each default is what it is."""

    recent_s: float = 60.0  # features are medians over this much recent history
    # Incremental evaluation (engine.py): a job with nothing new keeps its last candidates, for at most this long
    # (its stall and liveness rules read the clock: a job gone silent is judged again this often).
    rejudge_s: float = 30.0
    min_samples: int = 6  # a GPU with fewer samples in the window (a job just started) is not compared
    min_peers: int = 4  # fewer comparable GPUs/ranks than this: no peer comparison
    z_base: float = 3.5  # modified-z threshold for small groups (Iglewicz & Hoaglin)
    z_tail: float = 1e-4  # per-group false-flag budget; the threshold rises with group size
    max_outlier_frac: float = 0.10  # more outliers than this in a group is a shift, not stragglers
    # MAD floors: the smallest deviation that can count as one "sigma", per signal
    floor_clock_ratio: float = 0.01
    floor_power_ratio: float = 0.015
    floor_temperature_c: float = 1.5
    floor_wait_frac: float = 0.004
    floor_compute_share: float = 0.005  # half a percent of a step, for the median looks (short, recent)…
    floor_compute_share_long: float = 0.003  # …and the long look, a median of 5 minutes of evaluations (less noisy)
    min_steps: int = 5  # a rank with fewer steps in the recent window is not judged on data wait or compute share
    share_short_steps: int = 8  # compute share: the short look is the median of this many latest steps…
    # …and of every step that ended this many seconds before the newest: with fast steps (tens of ms) eight
    # steps are a fraction of a second, and a GC pause or a preempted thread moves their median.
    share_short_s: float = 20.0
    few_steps_extra_z: float = 1.0  # …judged against the group's threshold plus this, as is a median of fewer…
    share_few_steps: int = 16  # …steps than this in the recent look (long steps)…
    # …the long look averages each evaluation's window with this share (at least one step) trimmed off each end…
    share_trim: float = 0.1
    share_long_s: float = 300.0  # …over the evaluations of this much wall time (their median, judged as a few)…
    share_long_min_s: float = 120.0  # …spanning this: two recent windows, so one transient sits in half at most
    # What accumulates across judgements — a window into the long look, a step of the job baseline's drift —
    # does so at most this often: their constants were validated at one evaluation per 5 s, and a job judged as
    # its steps land (every second) would otherwise add five windows holding the same steps for each one (and
    # keep five times as many), and let its baseline drift five times as fast.
    accumulate_every_s: float = 5.0
    # Sequential evidence on compute share (detectors/sequential.py): per step a rank's log compute
    # factor over its group's median rank, in noise units (the window's MAD, at least seq_floor); each step adds
    # min(z, seq_cap) − seq_ref, and seq_h of it over a run of ≥ seq_min_steps steps, seq_frac of them past
    # seq_ref, lasting the minimum duration for its magnitude, is a finding that fires at once. Minimum
    # duration: seq_transient_s for a mean factor below seq_transient_factor (the benchmark's transient
    # controls plant up to 6 s at up to 1.6×, and a rank's and its node's can follow each other; longer below
    # seq_marginal_factor), seq_short_s above it (transients measured on real DDP last
    # ≤ 0.18 s at any factor: benchmarks/results/ddp_transients.md). Derivation: docs/detectors.md.
    seq_ref: float = 1.0
    seq_cap: float = 7.0
    seq_h: float = 12.0
    # …validated on peer groups of up to this many ranks (the benchmark's 16-node jobs). A larger group has more
    # ranks whose noise may chain into a run of evidence: it needs ln(ranks / seq_h_ranks) more (see
    # sequential.evidence_needed), so that the group's false alarms stay at the validated group's rate.
    seq_h_ranks: int = 128
    seq_min_steps: int = 2
    seq_frac: float = 0.9
    seq_floor: float = 0.01
    seq_transient_s: float = 10.0
    seq_transient_factor: float = 1.8
    seq_marginal_factor: float = 1.25  # below this factor the minimum duration grows as 1 / (factor − 1)
    seq_short_s: float = 2.0
    # The same test on data wait (io_starved_rank): per step a rank's data-wait share minus its group's median
    # rank's, in noise units (the window's MAD, at least seq_wait_floor: healthy loaders wait ~0.2 % of a step).
    # A missed prefetch is one step's event (0.2 % of steps in the benchmark's fleet, at most ~0.21 of its step),
    # so a run of mean excess below seq_wait_miss_max needs seq_wait_min_steps steps: four misses back to back on
    # one rank come ~0.004 times a job-day at 1,024 nodes (three: ~2); past it no run of misses explains it and
    # seq_min_steps do. It must also span seq_wait_s for a mean excess of seq_wait_large or more, longer below.
    seq_wait_floor: float = 0.01
    seq_wait_min_steps: int = 4
    seq_wait_miss_max: float = 0.3
    seq_wait_s: float = 2.0
    seq_wait_large: float = 0.1
    # In a step whose median rank waits wait_min_frac or more (a job whose pipeline is slow), a rank's step counts
    # as evidence only past this many noise units of that step's spread: its peers' loaders scatter by factors of
    # 2–4 step by step, and a rank near the top of that spread for a few steps is luck, not its own loader.
    seq_wait_busy_ref: float = 3.0
    # SM activity (GPM) against the node's GPUs at the same instant, for ranks without a compute share
    # (detectors/sm_activity.py): the highest and lowest sm_trim of a GPU's instants cut off, judged at the
    # group's threshold plus few_steps_extra_z (a mean of a dozen 1 s readings is heavy-tailed), MAD floor
    # floor_sm_active. Measured on the telemetry-only benchmark: docs/detection-benchmark.md.
    floor_sm_active: float = 0.02
    sm_trim: float = 0.25
    structure_learn_s: float = 60.0  # nodes deviating together this long after a job is first judged: its structure
    throttle_frac_min: float = 0.3  # a GPU throttled in at least 30 % of its samples (18 s of the minute)…
    throttle_peer_max: float = 0.1  # …while its peers' median is below this
    wait_min_frac: float = 0.04  # a rank must wait on data at least this fraction of its step (io_starved_rank)
    # io_starved_job, the whole pipeline slow: at least job_wait_rank_frac of the ranks wait job_wait_min_frac or
    # more, and the job's median wait — the share of its step time the data pipeline costs — is at least
    # job_min_cost_frac. A healthy job's loader often shows ~5 %: not worth a page (benchmarks/results/
    # detection_io_threshold.md).
    job_wait_rank_frac: float = 0.5
    job_wait_min_frac: float = 0.05
    job_min_cost_frac: float = 0.08
    # In a job whose median rank waits wait_min_frac or more, a rank's data wait is an outlier only at this many
    # times the job's median: the shared pipeline spreads the ranks' waits (each loader drains at its own pace;
    # up to ~1.8× in the benchmark's starved jobs), a rank whose own loader is slow waits far beyond.
    outlier_wait_ratio: float = 2.0
    node_min_gpus: int = 2  # this many straggling GPUs of one node (and ≥ half of its GPUs): the node
    slowdown_ratio: float = 1.10  # job step time above baseline × this: job slowdown
    baseline_min_steps: int = 10
    # …and the job's held steps must span this much wall time: a job's first seconds are not its normal pace
    # (a full prefetch buffer draining, warm-up, a host whose load changes), and a baseline learnt from them
    # made a fault-free job on a loaded host a "slowdown". A full recent window.
    baseline_min_s: float = 60.0
    baseline_alpha: float = 0.05
    hang_min_s: float = 10.0  # no step for max(this, hang_factor × baseline step time): stalled
    hang_factor: float = 3.0
    hang_busy_util: float = 0.5  # peers must look busy (spinning in a collective), else the job just ended
    # …and its processes must be known alive: a heartbeat (the SDK's push without steps, every push interval,
    # 5 s by default) at most this old, or the agents' job info on its GPUs. Else it ended or crashed.
    hang_alive_s: float = 20.0
    cpu_busy: float = 0.9  # host evidence: CPU-bound data loader
    iowait_high: float = 0.15  # host evidence: storage-bound data loader
