"""One sample cycle for 8 simulated GPUs against a bare loop making the same pynvml calls.

Everything runs in this process over one `SimulatedNvml` on a `ManualClock`. Before every timed
cycle of every variant the clock advances 1 simulated second, so each variant's first call per
GPU integrates the same 1 s of the thermal model: the model does the same work in all variants.

The bare loop is generated from the session's own choices: for each GPU, each reader of the tier
in `gpumond.nvml.calls.READERS` that the session did not mark unsupported, the call the session
settled on (`reader.calls[choice]`), written out as straight-line pynvml calls with the same
arguments. It is the floor: the same NVML work with nothing done to the results.

Variants are interleaved: every round runs each variant once, in a freshly shuffled order, and
ratios are taken per round (variant ÷ bare of the same round) as well as of the medians. Each call
is timed twice: CPU time of this thread (`time.thread_time`, the primary measure: other processes
on the shared 2-vCPU machine do not inflate it) and wall time (`time.perf_counter`, for reference).

    python benchmarks/agent_sample_cycle.py            # ~1 min
    python benchmarks/agent_sample_cycle.py --quick    # a few seconds (smoke test)
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import gc
import gzip
import io
import os
import pstats
import random
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pynvml  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric  # noqa: E402

import _bench  # noqa: E402
from gpumond.agent import gpu_series  # noqa: E402
from gpumond.agent.dcgm import DcgmCompat, dcgm_types  # noqa: E402
from gpumond.agent.exposition import Renderer  # noqa: E402
from gpumond.agent.host import HostEvidence  # noqa: E402
from gpumond.agent.jobs import JobAttributor  # noqa: E402
from gpumond.agent.metrics import metric_types  # noqa: E402
from gpumond.agent.sampler import Sampler  # noqa: E402
from gpumond.agent.sources.parts import NodeParts  # noqa: E402
from gpumond.agent.sources.registry import build as build_sources  # noqa: E402
from gpumond.nvml import calls  # noqa: E402
from gpumond.nvml.gpm import METRICS as GPM_METRICS  # noqa: E402
from gpumond.nvml.session import NvmlSession  # noqa: E402
from gpumond.nvml.sim import ManualClock, SimulatedNvml  # noqa: E402

GPUS = 8
TARGET = 1.2

# The pynvml call(s) each `Call.symbol` of calls.py makes, as source text over a handle `h`.
# Every chosen symbol must be here: a reader added to calls.py without a line here stops the run.
BARE_CALLS: dict[str, list[str]] = {
    "nvmlDeviceGetTemperatureV": ["nvmlDeviceGetTemperatureV(h, NVML_TEMPERATURE_GPU)"],
    "nvmlDeviceGetTemperature": ["nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU)"],
    "nvmlDeviceGetFieldValues": ["nvmlDeviceGetFieldValues(h, FAST_FIELD_IDS)"],
    "nvmlDeviceGetFieldValues(POWER_AVERAGE)": ["nvmlDeviceGetFieldValues(h, [NVML_FI_DEV_POWER_AVERAGE])"],
    "nvmlDeviceGetPowerUsage": ["nvmlDeviceGetPowerUsage(h)"],
    "nvmlDeviceGetEnforcedPowerLimit": ["nvmlDeviceGetEnforcedPowerLimit(h)"],
    "nvmlDeviceGetPowerManagementLimit": ["nvmlDeviceGetPowerManagementLimit(h)"],
    "nvmlDeviceGetTotalEnergyConsumption": ["nvmlDeviceGetTotalEnergyConsumption(h)"],
    "nvmlDeviceGetClockInfo(SM)": ["nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)"],
    "nvmlDeviceGetClockInfo(MEM)": ["nvmlDeviceGetClockInfo(h, NVML_CLOCK_MEM)"],
    "nvmlDeviceGetUtilizationRates": ["nvmlDeviceGetUtilizationRates(h)"],
    "nvmlDeviceGetMemoryInfo_v2": ["nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)"],
    "nvmlDeviceGetMemoryInfo": ["nvmlDeviceGetMemoryInfo(h)"],
    "nvmlDeviceGetCurrentClocksEventReasons": ["nvmlDeviceGetCurrentClocksEventReasons(h)"],
    "nvmlDeviceGetCurrentClocksThrottleReasons": ["nvmlDeviceGetCurrentClocksThrottleReasons(h)"],
    "nvmlDeviceGetPowerManagementLimitConstraints": ["nvmlDeviceGetPowerManagementLimitConstraints(h)"],
    "nvmlDeviceGetPowerManagementDefaultLimit": ["nvmlDeviceGetPowerManagementDefaultLimit(h)"],
    "nvmlDeviceGetMaxClockInfo(SM)": ["nvmlDeviceGetMaxClockInfo(h, NVML_CLOCK_SM)"],
    "nvmlDeviceGetTemperatureThreshold": [
        "nvmlDeviceGetTemperatureThreshold(h, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)",
        "nvmlDeviceGetTemperatureThreshold(h, NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)",
        "nvmlDeviceGetTemperatureThreshold(h, NVML_TEMPERATURE_THRESHOLD_GPU_MAX)",
    ],
    "nvmlDeviceGetTotalEccErrors": [
        f"nvmlDeviceGetTotalEccErrors(h, NVML_MEMORY_ERROR_TYPE_{t}, NVML_{s}_ECC)"
        for t in ("CORRECTED", "UNCORRECTED") for s in ("VOLATILE", "AGGREGATE")
    ],
    "nvmlDeviceGetRemappedRows": ["nvmlDeviceGetRemappedRows(h)"],
    "nvmlDeviceGetRetiredPages": [
        "nvmlDeviceGetRetiredPages(h, NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)",
        "nvmlDeviceGetRetiredPages(h, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)",
    ],
    "nvmlDeviceGetPcieReplayCounter": ["nvmlDeviceGetPcieReplayCounter(h)"],
    # GPM and NVLink make several pynvml calls each: written out in _bare_gpm / _bare_nvlink_* below.
    "nvmlGpmMetricsGet": ["_bare_gpm(h)"],
    "nvmlDeviceGetNvLinkState": ["_bare_nvlink_state(h)"],
    "nvmlDeviceGetFieldValues(NVLINK_THROUGHPUT_DATA)": ["_bare_nvlink_throughput(h)"],
    "nvmlDeviceGetNvLinkErrorCounter": ["_bare_nvlink_errors(h)"],
}
# The readers added for GPM and NVLink: the cycle without them is measured too, to give their cost.
GPM_NVLINK_READERS = frozenset({"gpm", "nvlink_state", "nvlink_throughput", "nvlink_errors"})


class _BareGpm:
    """GPM the shortest way: per GPU two samples, one SampleGet and one MetricsGet per call, same metric ids."""

    def __init__(self) -> None:
        self._pairs: dict[object, list[object]] = {}
        self._req = pynvml.c_nvmlGpmMetricsGet_t()
        self._req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        ids = list(gpm_ids())
        self._req.numMetrics = len(ids)
        for i, metric_id in enumerate(ids):
            self._req.metrics[i].metricId = metric_id

    def __call__(self, h: object) -> None:
        key = ctypes.cast(h, ctypes.c_void_p).value
        pair = self._pairs.get(key)
        if pair is None:
            pair = self._pairs[key] = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
            pynvml.nvmlGpmSampleGet(h, pair[0])
            return
        pynvml.nvmlGpmSampleGet(h, pair[1])
        self._req.sample1, self._req.sample2 = pair[0], pair[1]
        pair.reverse()
        pynvml.nvmlGpmMetricsGet(self._req)


def _links(h: object) -> int:
    return int(pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])[0].value.uiVal)


def _bare_nvlink_state(h: object) -> None:
    for link in range(_links(h)):
        pynvml.nvmlDeviceGetNvLinkState(h, link)


def _bare_nvlink_throughput(h: object) -> None:
    pynvml.nvmlDeviceGetFieldValues(h, [(f, link) for link in range(_links(h)) for f in (
        pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)])


def _bare_nvlink_errors(h: object) -> None:
    for link in range(_links(h)):
        for counter in range(4):  # replay, recovery, CRC flit, CRC data
            pynvml.nvmlDeviceGetNvLinkErrorCounter(h, link, counter)


class _PromClientCollector:
    """Reference encoder: the same series through prometheus-client's metric families and generate_latest
    (what a collector-based exporter does, and what the agent did before its own encoder)."""

    def __init__(self, series: list, types: dict[str, tuple[str, str]]) -> None:
        self._series, self._types = series, types

    def describe(self) -> list[Metric]:
        return []

    def collect(self):  # noqa: ANN201
        families: dict[str, Metric] = {}
        for s in self._series:
            fam = families.get(s.name)
            if fam is None:
                kind, help_ = self._types.get(s.name, ("gauge", ""))
                names = [k for k, _ in s.labels]
                fam = (CounterMetricFamily(s.name.removesuffix("_total"), help_, labels=names) if kind == "counter"
                       else GaugeMetricFamily(s.name, help_, labels=names))
                families[s.name] = fam
            fam.add_metric([v for _, v in s.labels], s.value)
        yield from families.values()


class _NoXids:
    """XID source for the 'as the agent wires it' variant: the real watcher's counts() is a locked dict copy."""

    healthy = True
    error = None

    def counts(self) -> dict[tuple[int, int], int]:
        return {}

    def last(self) -> dict[int, int]:
        return {}


def gpm_ids() -> list[int]:
    return list(GPM_METRICS)


def _namespace() -> dict[str, object]:
    ns: dict[str, object] = {k: getattr(pynvml, k) for k in dir(pynvml) if k.startswith(("nvml", "NVML"))}
    ns["FAST_FIELD_IDS"] = list(calls.FAST_FIELDS)
    ns.update(_bare_gpm=_BareGpm(), _bare_nvlink_state=_bare_nvlink_state,
              _bare_nvlink_throughput=_bare_nvlink_throughput, _bare_nvlink_errors=_bare_nvlink_errors)
    return ns


def chosen_calls(session: NvmlSession, tier: str) -> list[tuple[int, object, list[str]]]:
    """(gpu index, handle, pynvml call expressions) exactly as the session reads `tier` now.

    Reads the session's per-GPU probe results (`_gpus`, `choice`, `unsupported`): private, on purpose,
    so that the bare loop cannot drift from what the session really calls.
    """
    out = []
    ns = _namespace()
    for g in session._gpus:  # noqa: SLF001
        if g.lost:
            continue
        exprs: list[str] = []
        for reader in calls.READERS:
            if reader.tier != tier or reader.name in g.unsupported:
                continue
            call = reader.calls[g.choice.get(reader.name, 0)]
            exprs_for = BARE_CALLS.get(call.symbol)
            if exprs_for is None:
                # A reader added to calls.py after this table: a symbol that is a one-argument pynvml
                # function is taken as is (checked by calling it once); anything else stops the run.
                if not (call.symbol.isidentifier() and hasattr(pynvml, call.symbol)):
                    raise SystemExit(f"benchmark out of date: no bare pynvml call for {call.symbol!r} "
                                     f"(reader {reader.name}); add it to BARE_CALLS")
                exprs_for = [f"{call.symbol}(h)"]
            for expr in exprs_for:
                try:  # a sub-call the reader tolerates failing (a threshold a board lacks) is not made
                    eval(expr, ns, {"h": g.handle})  # noqa: S307 - our own table
                except pynvml.NVMLError_NotSupported:
                    continue
                exprs.append(expr)
        plan = getattr(session, "_plan", None)
        if plan is not None:  # the session's own per-GPU plan (where it has one) must name the same calls
            theirs = [c.symbol for _, c in plan(g, tier)]
            ours = [reader.calls[g.choice.get(reader.name, 0)].symbol for reader in calls.READERS
                    if reader.tier == tier and reader.name not in g.unsupported]
            if theirs != ours:
                raise SystemExit(f"benchmark out of date: session plans {theirs}, READERS give {ours}")
        out.append((g.identity.index, g.handle, exprs))
    return out


def make_bare(session: NvmlSession, tier: str) -> tuple[Callable[[], None], Counter[str]]:
    """A generated straight-line function making the tier's pynvml calls for every GPU."""
    plan = chosen_calls(session, tier)
    ns = _namespace()
    lines = ["def bare():"]
    for index, handle, exprs in plan:
        ns[f"h{index}"] = handle
        lines.append(f"    h = h{index}")
        lines += [f"    {e}" for e in exprs]
    if len(lines) == 1:
        lines.append("    pass")
    exec("\n".join(lines), ns)  # noqa: S102 - generated from our own table
    census = Counter(e.split("(")[0] for _, _, exprs in plan for e in exprs)
    return ns["bare"], census  # type: ignore[return-value]


def make_readers_loop(session: NvmlSession, tier: str) -> Callable[[], None]:
    """The chosen `Call.fn` of calls.py per GPU and reader: the decoding into dicts, without the session."""
    plan = []
    for g in session._gpus:  # noqa: SLF001
        for reader in calls.READERS:
            if reader.tier == tier and reader.name not in g.unsupported:
                plan.append((reader.calls[g.choice.get(reader.name, 0)].fn, g.handle))

    def loop() -> None:
        for fn, h in plan:
            fn(h)

    return loop


def interleave(variants: dict[str, Callable[[], object]], rounds: int, advance: Callable[[], None],
               no_clock: frozenset[str] = frozenset(), seed: int = 1
               ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Run every variant once per round in a shuffled order; per-call (thread CPU s, wall s) per variant."""
    rng = random.Random(seed)
    names = list(variants)
    cpu: dict[str, list[float]] = {n: [] for n in names}
    wall: dict[str, list[float]] = {n: [] for n in names}
    pc, tt = time.perf_counter, time.thread_time
    for _ in range(rounds):
        rng.shuffle(names)
        for n in names:
            if n not in no_clock:
                advance()
            fn = variants[n]
            w0, c0 = pc(), tt()
            fn()
            c1, w1 = tt(), pc()
            cpu[n].append(c1 - c0)
            wall[n].append(w1 - w0)
    return cpu, wall


def ratio_rows(times: dict[str, list[float]], wall: dict[str, list[float]], labels: dict[str, str], base: str,
               measured: list[str]) -> list[list[str]]:
    """Markdown rows: spread of per-cycle CPU time, ratio of medians, per-round (paired) ratios, wall ratio."""
    bmed = statistics.median(times[base])
    wmed = statistics.median(wall[base])
    rows = []
    for n in measured:
        lo, med, p90 = _bench.spread(times[n])
        wratio = statistics.median(wall[n]) / wmed
        if n == base:
            rows.append([labels[n], _bench.fmt_us(lo), _bench.fmt_us(med), _bench.fmt_us(p90), "1.00", "—",
                         f"1.00 ({_bench.fmt_us(wmed)})", "—"])
            continue
        paired = [a / b for a, b in zip(times[n], times[base])]
        plo, pmed, p90r = _bench.spread(paired)
        ratio = med / bmed
        rows.append([labels[n], _bench.fmt_us(lo), _bench.fmt_us(med), _bench.fmt_us(p90), f"{ratio:.2f}",
                     f"{plo:.2f} / {pmed:.2f} / {p90r:.2f}", f"{wratio:.2f}", "yes" if ratio <= TARGET else "**no**"])
    return rows


_AREAS = (
    ("pynvml wrappers + ctypes", ("pynvml", "ctypes")),
    ("simulated NVML (the driver's stand-in)", ("gpumond/nvml/sim",)),
    ("session + readers (gpumond/nvml)", ("gpumond/nvml",)),
    ("series, sources, sampler (gpumond/agent)", ("gpumond/agent/gpu_series", "gpumond/agent/sources",
                                                  "gpumond/agent/sampler", "gpumond/agent/readings",
                                                  "gpumond/types", "gpumond/agent/exposition")),
    ("prometheus-client encoding", ("prometheus_client",)),
    ("gzip / zlib", ("gzip", "zlib")),
)


def _area(filename: str, func: str) -> str:
    key = filename.replace("\\", "/")
    if filename == "~":  # builtins: attribute the C parts we know
        if "zlib" in func or "compress" in func:
            return "gzip / zlib"
        return "builtins (dict/list/str/float ops, sorting …)"
    for area, needles in _AREAS:
        if any(n in key for n in needles):
            return area
    return "other Python (dataclasses, typing, functools …)"


def profile_fast_cycle(sampler: Sampler, clock: ManualClock, cycles: int) -> tuple[str, str]:
    """cProfile the sampler's fast cycle; return (area table, top-functions text)."""
    prof = cProfile.Profile()
    for _ in range(cycles):
        clock.advance(1.0)
        prof.enable()
        sampler.fast_cycle()
        prof.disable()
    st = pstats.Stats(prof)
    by_area: dict[str, float] = defaultdict(float)
    total = 0.0
    for (filename, _line, func), (_cc, _nc, tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        by_area[_area(filename, func)] += tt
        total += tt
    rows = [[a, f"{t / cycles * 1e6:,.0f} µs", f"{100 * t / total:.0f} %"]
            for a, t in sorted(by_area.items(), key=lambda kv: -kv[1])]
    table = _bench.md_table(["where (cProfile tottime)", "per cycle", "share"], rows)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("tottime").print_stats(18)
    text = buf.getvalue()
    text = text[text.find("ncalls"):] if "ncalls" in text else text
    return table, text.rstrip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short run for a smoke test")
    ap.add_argument("--rounds", type=int, help="fast-tier rounds (default 3000, quick 150)")
    args = ap.parse_args(argv)
    fast_rounds = args.rounds or (150 if args.quick else 3000)
    slow_rounds = max(fast_rounds // 3, 30)
    prof_cycles = 50 if args.quick else 500

    clock = ManualClock()
    sim = SimulatedNvml(gpu_count=GPUS, node="bench-node", clock=clock)
    session = NvmlSession(install=sim.install, clock=clock.now)
    session.open()
    # The same node read without the GPM and NVLink readers: what those cost per cycle.
    without = NvmlSession(install=sim.install, clock=clock.now,
                          readers=tuple(r for r in calls.build_readers() if r.name not in GPM_NVLINK_READERS))
    without.open()
    try:
        return run(args, session, clock, fast_rounds, slow_rounds, prof_cycles, without)
    finally:
        without.close()
        session.close()
        sim.uninstall()


def run(args: argparse.Namespace, session: NvmlSession, clock: ManualClock, fast_rounds: int,
        slow_rounds: int, prof_cycles: int, without: NvmlSession) -> int:
    # Warm up: the first reads probe each GPU and settle every reader's choice.
    for _ in range(3):
        clock.advance(1.0)
        for s in (session, without):
            s.read("fast")
            s.read("slow")

    hostname = "bench-node"
    bare_fast, fast_census = make_bare(session, "fast")
    bare_slow, slow_census = make_bare(session, "slow")
    def sampler(renderer: Renderer, **parts: Any) -> Sampler:
        return Sampler(session, build_sources(NodeParts(session, hostname=hostname, **parts)), renderer=renderer)

    plain = sampler(Renderer())
    wired = sampler(Renderer(), xid=_NoXids(), host=HostEvidence(), jobs=JobAttributor())
    # (e): (d) with exposition.dcgm_compat on, as Agent wires it (its renderer knows the DCGM_FI_* types too).
    dcgm = sampler(Renderer(types=metric_types() | dcgm_types()), xid=_NoXids(), host=HostEvidence(),
                   jobs=JobAttributor(), dcgm=DcgmCompat(hostname=hostname))
    # (f): (d) with exposition.nvlink_per_link on: each link's throughput and error counters as well.
    per_link = sampler(Renderer(), xid=_NoXids(), host=HostEvidence(), jobs=JobAttributor(), nvlink_per_link=True)
    for s in (plain, wired, dcgm, per_link):
        s.slow_cycle()
        s.fast_cycle()
    snapshot = plain.last_snapshot
    assert snapshot is not None and plain.latest is not None
    n_series = _bench.count_series(plain.latest.plain)
    plain_bytes, gz_bytes = len(plain.latest.plain), len(plain.latest.gzipped)
    size = {}  # variant → (series, plain bytes, gzip bytes) of its last exposition
    for key, sampler in (("d", wired), ("e", dcgm), ("f", per_link)):
        assert sampler.latest is not None
        size[key] = (_bench.count_series(sampler.latest.plain), len(sampler.latest.plain),
                     len(sampler.latest.gzipped))
    renderer = Renderer()
    types = metric_types()
    all_series = sorted((s for r in snapshot.results for s in r.series), key=lambda s: s.name)

    def encode_reference() -> bytes:
        reg = CollectorRegistry(auto_describe=False)
        reg.register(_PromClientCollector(all_series, types))  # type: ignore[arg-type]
        return generate_latest(reg)

    body = plain.latest.plain
    level = int(getattr(renderer, "_gzip_level", 6))
    encode = getattr(renderer, "encode", None)  # the agent's own encoder, where it has one
    same_bytes = encode is not None and encode(all_series) == encode_reference()

    fast = {
        "bare": bare_fast,
        "readers": make_readers_loop(session, "fast"),
        "a": lambda: session.read("fast"),
        "a0": lambda: without.read("fast"),
        "b": lambda: gpu_series.tier_series(session.read("fast"), with_up=True),
        "c": plain.fast_cycle,
        "d": wired.fast_cycle,
        "e": dcgm.fast_cycle,
        "f": per_link.fast_cycle,
        "render": lambda: renderer.render(snapshot),
        "encode_ref": encode_reference,
        "gzip": lambda: gzip.compress(body, level),
    }
    if encode is not None:
        fast["encode"] = lambda: encode(all_series)
    timed_alone = frozenset({"render", "encode", "encode_ref", "gzip"})
    slow = {
        "bare": bare_slow,
        "readers": make_readers_loop(session, "slow"),
        "a": lambda: session.read("slow"),
        "a0": lambda: without.read("slow"),
        "b": lambda: gpu_series.tier_series(session.read("slow"), with_up=False),
        "c": plain.slow_cycle,
        "d": wired.slow_cycle,
        "e": dcgm.slow_cycle,
        "f": per_link.slow_cycle,
    }

    def advance() -> None:
        clock.advance(1.0)

    gc.collect()
    t0 = time.monotonic()
    load_before = os.getloadavg()
    ft, ft_wall = interleave(fast, fast_rounds, advance, no_clock=timed_alone, seed=1)
    st, st_wall = interleave(slow, slow_rounds, advance, seed=2)
    load_after = os.getloadavg()
    bench_s = time.monotonic() - t0
    area_table, top = profile_fast_cycle(plain, clock, prof_cycles)

    fast_labels = {
        "bare": "bare pynvml loop (the floor)",
        "readers": "calls.py reader functions only (decode to dicts, no session)",
        "a": "(a) `NvmlSession.read(\"fast\")`",
        "a0": "(a0) (a) without the GPM reader",
        "b": "(b) (a) + `gpu_series.tier_series`",
        "c": "(c) `Sampler.fast_cycle()` (NVML only): series + snapshot + render + gzip",
        "d": "(d) `Sampler.fast_cycle()` as `Agent` wires it (+ host evidence via psutil, XID counts)",
        "e": "(e) (d) with `exposition.dcgm_compat` on (DCGM_FI_* series as well)",
        "f": "(f) (d) with `exposition.nvlink_per_link` on (each link's counters as well)",
    }
    slow_labels = {
        "bare": "bare pynvml loop (the floor)",
        "readers": "calls.py reader functions only",
        "a": "(a) `NvmlSession.read(\"slow\")`",
        "a0": "(a0) (a) without the NVLink readers (state, throughput, error counters of 18 links)",
        "b": "(b) (a) + `gpu_series.tier_series`",
        "c": "(c) `Sampler.slow_cycle()` (NVML only; rendering happens on the next fast cycle)",
        "d": "(d) `Sampler.slow_cycle()` + job attribution (adds 8 `GetComputeRunningProcesses`, not in bare)",
        "e": "(e) (d) with `exposition.dcgm_compat` on",
        "f": "(f) (d) with `exposition.nvlink_per_link` on",
    }
    hdr = ["variant", "CPU min", "CPU median", "CPU p90", "ratio of medians", "paired ratio min / median / p90",
           "wall-time ratio of medians", f"≤ {TARGET}?"]
    order = ["bare", "readers", "a0", "a", "b", "c", "d", "e", "f"]
    med = {k: statistics.median(v) for k, v in ft.items()}

    def calls_line(census: Counter[str]) -> str:
        total = sum(census.values())
        return f"{total} pynvml calls per cycle ({total // GPUS} per GPU): " + ", ".join(
            f"`{k}`×{v // GPUS}" for k, v in census.items())

    parts = [
        "# Agent sample cycle vs a bare pynvml loop (8 simulated GPUs)",
        "",
        _bench.machine_block({
            "setup": f"{GPUS} simulated H100 (default scenario: training load), `ManualClock` advanced 1 s "
                     f"before every timed cycle of every variant; {fast_rounds} fast rounds, {slow_rounds} slow "
                     f"rounds, variants shuffled within each round; timing loop {bench_s:.0f} s",
            "exposition": f"{n_series} series, {plain_bytes:,} bytes plain, {gz_bytes:,} bytes gzip (level {level})",
            "load average (1 min) before / after the timing loop": f"{load_before[0]:.2f} / {load_after[0]:.2f} "
                                                                   f"on {os.cpu_count()} CPUs",
        }),
        "",
        "## Exposition size by option",
        "",
        _bench.md_table(["exposition (one scrape)", "series", "bytes plain", "bytes gzip"], [
            [fast_labels[k], f"{n:,}", f"{p:,}", f"{g:,}"] for k, (n, p, g) in size.items()]),
        "",
        "`exposition.nvlink_per_link` adds, per GPU, 6 series per NVLink (throughput tx/rx and four error "
        "counters): 18 links on an H100. The NVML calls are the same either way (the per-GPU totals are sums of "
        "the per-link reads, which the agent's NVLink alerts use); the cost is series, bytes and encoding.",
        "",
        "## Fast tier (every 1 s)",
        "",
        calls_line(fast_census) + ".",
        "",
        _bench.md_table(hdr, ratio_rows(ft, ft_wall, fast_labels, "bare", order)),
        "",
        "Times are CPU time of the benchmark thread per call (the whole cycle runs on it). Paired ratios "
        "divide a variant's time by the bare loop's in the same round. The wall-time column is the same ratio "
        "from `perf_counter`; on this shared machine long variants are preempted more often, which inflates "
        "their wall-time medians.",
        "",
        "Where the median fast cycle (c) goes, by differences of CPU-time medians from the same run:",
        "",
        _bench.md_table(["step", "median cost", "share of (c)"], [
            [name, _bench.fmt_us(v), f"{100 * v / med['c']:.0f} %"] for name, v in (
                ("NVML calls (bare loop)", med["bare"]),
                ("session bookkeeping + readers' decoding: (a) − bare", med["a"] - med["bare"]),
                ("  of which the GPM reader: (a) − (a0)", med["a"] - med["a0"]),
                ("conversion to series: (b) − (a)", med["b"] - med["a"]),
                ("info/self series, snapshot, render + gzip: (c) − (b)", med["c"] - med["b"]),
            )] + [
            ["  of which `Renderer.render` (encode + gzip), timed alone", _bench.fmt_us(med["render"]),
             f"{100 * med['render'] / med['c']:.0f} %"],
        ] + ([
            ["    of which `Renderer.encode`, timed alone", _bench.fmt_us(med["encode"]),
             f"{100 * med['encode'] / med['c']:.0f} %"]] if "encode" in med else []) + [
            [f"    of which `gzip.compress(level {level})`, timed alone", _bench.fmt_us(med["gzip"]),
             f"{100 * med['gzip'] / med['c']:.0f} %"],
            ["host evidence + XID source: (d) − (c)", _bench.fmt_us(med["d"] - med["c"]),
             f"{100 * (med['d'] - med['c']) / med['c']:.0f} %"],
            ["`exposition.dcgm_compat` on: (e) − (d)", _bench.fmt_us(med["e"] - med["d"]),
             f"{100 * (med['e'] - med['d']) / med['c']:.0f} %"],
            ["`exposition.nvlink_per_link` on: (f) − (d)", _bench.fmt_us(med["f"] - med["d"]),
             f"{100 * (med['f'] - med['d']) / med['c']:.0f} %"],
            ["*reference, not in the cycle:* prometheus-client `generate_latest` on the same series",
             _bench.fmt_us(med["encode_ref"]), f"{100 * med['encode_ref'] / med['c']:.0f} %"],
        ]),
        "",
        ("The agent's encoder output is byte-identical to `generate_latest` on these series."
         if same_bytes else "Note: the agent's encoder output differs from `generate_latest` on these series"
         if encode is not None else ""),
        "",
        "GPM and NVLink calls are counted once per reader above (`_bare_gpm`: one `nvmlGpmSampleGet` and one "
        "`nvmlGpmMetricsGet`; `_bare_nvlink_state`: one field-values call for the link count and one "
        "`nvmlDeviceGetNvLinkState` per link; `_bare_nvlink_throughput`: two field-values calls; "
        "`_bare_nvlink_errors`: the link count and four `nvmlDeviceGetNvLinkErrorCounter` per link). The "
        "simulated driver answers them in microseconds; a real driver's GPM and NVLink calls cost more.",
        "",
        "## Slow tier (every 30 s)",
        "",
        calls_line(slow_census) + ".",
        "",
        _bench.md_table(hdr, ratio_rows(st, st_wall, slow_labels, "bare", order)),
        "",
        f"## Profile of (c), {prof_cycles} cycles under cProfile",
        "",
        "cProfile inflates Python-level costs (it adds a hook to every call), so read shares, not absolute "
        "times.",
        "",
        area_table,
        "",
        "<details><summary>top functions by own time</summary>",
        "",
        "```",
        top,
        "```",
        "</details>",
    ]
    _bench.write_result("agent_sample_cycle", "\n".join(parts), quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
