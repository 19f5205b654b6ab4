"""A finding's evidence in a few whole sentences: the fields that matter for each kind, in full words."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Evidence = Mapping[str, Any]

_LOOKS = {"short": "its last few steps", "recent": "the recent window", "long": "the long look (minutes)"}


def _pct(v: Any) -> str:
    try:
        text = f"{float(v) * 100:.0f}"
    except (TypeError, ValueError):
        return "?"
    return ("0" if text == "-0" else text) + " %"  # a share a hair below zero (clock rounding) reads as 0 %


def _num(v: Any, fmt: str = "g") -> str:
    try:
        return format(float(v), fmt)
    except (TypeError, ValueError):
        return "?"


def _signal(name: str, s: Mapping[str, Any]) -> str:
    value, peers, z = s.get("value"), s.get("peer_median"), _num(s.get("z"), ".1f")
    if name == "compute_share":
        look = _LOOKS.get(str(s.get("look")), str(s.get("look", "")))
        return (f"computes {_pct(value)} of each step vs {_pct(peers)} for its peers, who wait for it "
                f"(over {look}; z {z})")
    if name == "sm_clock_ratio":
        return f"SM clock at {_pct(value)} of its maximum vs {_pct(peers)} for its peers (z {z})"
    if name == "power_ratio":
        return f"power at {_pct(value)} of its limit vs {_pct(peers)} for its peers (z {z})"
    if name == "temperature_c":
        return f"temperature {_num(value, '.0f')} °C vs {_num(peers, '.0f')} °C for its peers (z {z})"
    if name == "throttled":
        return f"throttled in {_pct(value)} of samples vs {_pct(peers)} for its peers"
    return f"{name} {value} vs {peers} for its peers (z {z})"


def _straggler(ev: Evidence, node: str | None, power: bool) -> list[str]:
    signals = ev.get("signals")
    out = [_signal(str(n), s) for n, s in signals.items() if isinstance(s, Mapping) and (power or n != "power_ratio")] \
        if isinstance(signals, Mapping) else []
    if "sm_active" in ev:  # GPM: how much of the GPU works, against its peers
        out.append(f"SM activity {_pct(ev['sm_active'])}"
                   + (f" vs {_pct(ev['peer_median_sm_active'])} for its peers" if "peer_median_sm_active" in ev else ""))
    if ev.get("likely_cause") == "nvlink_errors":
        out.append(_cause(ev, node))
    reasons = ev.get("throttle_reasons")
    if isinstance(reasons, list) and reasons:
        out.append("throttle reasons: " + ", ".join(str(r) for r in reasons))
    return out


def _cause(ev: Evidence, node: str | None) -> str:
    """The detector's likely_cause, said so that "unknown" reads as what was checked, never as a miss."""
    cause = str(ev.get("likely_cause", ""))
    host = []
    if "host_cpu_utilization" in ev:
        host.append(f"CPU {_pct(ev['host_cpu_utilization'])} busy")
    if "host_cpu_iowait" in ev:
        host.append(f"iowait {_pct(ev['host_cpu_iowait'])}")
    seen = f" ({node + ': ' if node else ''}{', '.join(host)})" if host else ""
    if cause == "nvlink_errors":
        rates = ev.get("nvlink_replays_per_s")
        said = (f" ({len(rates)} GPU(s) replaying)" if isinstance(rates, Mapping)
                else f" ({rates:g} replays/s)" if isinstance(rates, (int, float)) else "")
        return f"likely cause: NVLink — replays slow every collective through it{said}"
    if cause.startswith("storage"):
        return f"likely cause: storage — the host waits on disk{seen}"
    if cause.startswith("cpu"):
        return f"likely cause: CPU — the host is saturated{seen}"
    if "no host evidence" in cause:
        return f"likely cause: not known — the agent{' on ' + node if node else ''} reports no host CPU or iowait"
    if cause.startswith("unknown"):
        return (f"likely cause: not CPU or disk contention on the host{seen}; look at the loader itself, "
                "network storage or sharding")
    return f"likely cause: {cause}" if cause else ""


def _io_rank(ev: Evidence, node: str | None, power: bool) -> list[str]:
    out = [f"waits on its data loader {_pct(ev.get('data_wait_frac'))} of each step vs "
           f"{_pct(ev.get('peer_median_data_wait_frac'))} for its peers"]
    gpu = [x for x in (("gpu_utilization" in ev and f"utilization {_pct(ev['gpu_utilization'])}"),
                       (power and "gpu_power_ratio" in ev and f"power {_pct(ev['gpu_power_ratio'])} of its limit"))
           if x]
    if gpu:
        out.append("its GPU: " + ", ".join(gpu))
    cause = _cause(ev, node)
    if cause.startswith(("likely cause: storage", "likely cause: CPU")):
        cause += " — in this demo every node reports this machine's real CPU and iowait"
    return out + ([cause] if cause else [])


def _io_job(ev: Evidence, node: str | None, power: bool) -> list[str]:
    nodes = ev.get("nodes") if isinstance(ev.get("nodes"), list) else []
    return [f"{ev.get('ranks_starved', '?')} of {ev.get('ranks', '?')} ranks wait on data "
            f"(median {_pct(ev.get('median_data_wait_frac'))} of each step): the data pipeline cannot keep up",
            *(["nodes: " + ", ".join(str(n) for n in nodes)] if nodes else [])]


def _slowdown(ev: Evidence, node: str | None, power: bool) -> list[str]:
    return [f"step time {_num(ev.get('step_time_s'), '.3f')} s vs its own baseline "
            f"{_num(ev.get('baseline_step_time_s'), '.3f')} s ({_num(ev.get('slowdown'), '.2f')}×)"]


def _hung(ev: Evidence, node: str | None, power: bool) -> list[str]:
    out = [f"no step for {_num(ev.get('stalled_for_s'), '.0f')} s (limit {_num(ev.get('limit_s'), '.0f')} s)"]
    if "gpu_utilization" in ev:
        out.append(f"its GPU idles at {_pct(ev['gpu_utilization'])} while peers spin at "
                   f"{_pct(ev.get('peer_median_utilization'))}")
    elif ev.get("localised") is False:
        out.append("no single rank stands out")
    return out


def _straggler_node(ev: Evidence, node: str | None, power: bool) -> list[str]:
    ranks = ev.get("ranks") if isinstance(ev.get("ranks"), list) else []
    return [f"{ev.get('gpus_flagged', '?')} of its {ev.get('gpus_on_node', '?')} GPUs are slower than their peers"
            + (f" (ranks {', '.join(str(r) for r in ranks)})" if ranks else ""), _cause(ev, node)]


_BY_KIND: dict[str, Callable[[Evidence, str | None, bool], list[str]]] = {
    "straggler": _straggler, "straggler_node": _straggler_node, "io_starved_rank": _io_rank,
    "io_starved_job": _io_job, "job_slowdown": _slowdown, "hung_rank": _hung,
}


def describe(kind: str, evidence: Evidence, node: str | None = None, *, power: bool = True) -> tuple[str, ...]:
    """Readable lines for a finding's evidence; a kind this module does not know shows its fields whole.

    `power=False` leaves out power-to-limit ratios: the rules service derives them from the energy counter over
    wall time, so under a simulated clock running faster than wall time they read that many times too high.
    """
    fn = _BY_KIND.get(kind)
    if fn is None:
        return tuple(f"{k}: {v}" for k, v in evidence.items())
    return tuple(line for line in fn(evidence, node, power) if line)
