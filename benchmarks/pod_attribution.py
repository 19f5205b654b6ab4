"""What pod attribution through the kubelet's pod-resources API costs per sample cycle, and off it.

A node of 8 simulated H100s, 4 whole and 4 in MIG mode with seven 1g.10gb slices each: 32 devices,
each running one process (a fake process table: the job lookup hits its cache, as in steady state)
and each assigned to a pod by a kubelet stand-in, a real gRPC server on a unix socket speaking the
pod-resources v1 proto (tests/podresources_server.py), which also lists CPU-only pods.

Measured, interleaved in shuffled order every round (CPU time of this thread, `time.thread_time`,
the primary measure on this shared machine; wall time for reference):
- the slow cycle's attribution sources (`pod_resources` + `jobs`) with the kubelet's answer, and the
  `jobs` source alone without pod-resources (processes only): their difference is what pod
  attribution adds to a sample cycle;
- the slow cycle as a whole, both ways;
- off the sampling path, one `List` call by the poller's thread (call, decode, keep), for 0, 100 and
  1,000 CPU-only pods beside the 32 GPU pods;
- the fast cycle's MIG source (`nvml_mig`: 28 instances' identity and memory).

    python benchmarks/pod_attribution.py            # ~1 min
    python benchmarks/pod_attribution.py --quick    # a few seconds (smoke test)
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _bench  # noqa: E402
from gpumond.agent.jobs import JobAttributor  # noqa: E402
from gpumond.agent.podresources.client import PodResourcesClient  # noqa: E402
from gpumond.agent.sampler import Sampler  # noqa: E402
from gpumond.agent.sources import Cycle, Tiers, run_sources  # noqa: E402
from gpumond.agent.sources.parts import NodeParts  # noqa: E402
from gpumond.agent.sources.registry import build as build_sources  # noqa: E402
from gpumond.nvml.session import NvmlSession  # noqa: E402
from gpumond.nvml.sim import ManualClock, Scenario, SimulatedNvml  # noqa: E402
from tests.fakes import HostProcess  # noqa: E402
from tests.podresources_server import PodResourcesServer, pod  # noqa: E402

GPUS, MIG_GPUS, SLICES = 8, 4, 7


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    c0, w0 = time.thread_time(), time.perf_counter()
    fn()
    return time.thread_time() - c0, time.perf_counter() - w0


def _kubelet_pods(sim: SimulatedNvml, cpu_only: int) -> list:
    out = []
    for g in sim.gpus:
        if g.mig:
            out += [pod("ml", f"infer-{g.index}-{m.index}", ("srv", "nvidia.com/mig-1g.10gb", [m.uuid]))
                    for m in g.mig]
        else:
            out.append(pod("ml", f"trainer-{g.index}", ("main", "nvidia.com/gpu", [g.uuid])))
    out += [pod("web", f"frontend-{i}", ("app", "example.com/none", [])) for i in range(cpu_only)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short run for a smoke test")
    ap.add_argument("--rounds", type=int, help="rounds (default 400, quick 20)")
    args = ap.parse_args(argv)
    rounds = args.rounds or (20 if args.quick else 400)

    clock = ManualClock()
    scenario = Scenario.model_validate({"gpus": [{"index": i, "mig": ["1g.10gb"] * SLICES}
                                                 for i in range(GPUS - MIG_GPUS, GPUS)]})
    sim = SimulatedNvml(gpu_count=GPUS, node="bench-node", clock=clock, scenario=scenario)
    pid = 1000
    for g in sim.gpus:
        if g.mig:
            for m in g.mig:
                sim.set_mig_processes(g.index, m.index, [pid])
                pid += 1
        else:
            sim.set_processes(g.index, [pid])
            pid += 1
    procs = {p: HostProcess({"GPUMOND_JOB_ID": f"job-{p % 5}"}) for p in range(1000, pid)}
    session = NvmlSession(install=sim.install, clock=clock.now)
    session.open()
    tmp = tempfile.TemporaryDirectory()
    try:
        with PodResourcesServer(Path(tmp.name) / "kubelet.sock") as kubelet:
            return run(args, rounds, sim, session, clock, kubelet, procs)
    finally:
        tmp.cleanup()
        session.close()
        sim.uninstall()


def run(args: argparse.Namespace, rounds: int, sim: SimulatedNvml, session: NvmlSession, clock: ManualClock,
        kubelet: PodResourcesServer, procs: dict[int, HostProcess]) -> int:
    kubelet.pods = _kubelet_pods(sim, 100)
    client = PodResourcesClient(kubelet.socket_path, timeout_s=5.0, interval_s=3600.0, clock=clock.now)
    assert client.poll(), client.error

    def attributor() -> JobAttributor:
        return JobAttributor(process_factory=procs.__getitem__, cgroup_reader=lambda p: "0::/\n")

    with_pods_sources = build_sources(NodeParts(session, hostname="bench-node", jobs=attributor(), pods=client))
    without_sources = build_sources(NodeParts(session, hostname="bench-node", jobs=attributor()))
    with_pods, without = Sampler(session, with_pods_sources), Sampler(session, without_sources)
    for s in (with_pods, without):  # warm the caches and check what is being measured
        s.slow_cycle()
        s.fast_cycle()
    rows = [x for r in with_pods.slow_cycle() if r.source == "jobs" for x in r.series]
    labelled = sum(1 for x in rows if "pod" in dict(x.labels))
    assert labelled == GPUS - MIG_GPUS + MIG_GPUS * SLICES, f"only {labelled} devices got their pod"

    def sources(tiers: Tiers) -> Callable[[], object]:
        # The slow cycle's sources after the NVML read: pod_resources (when given), then jobs.
        after_nvml = [s for s in tiers.slow if s.name in ("pod_resources", "jobs")]
        return lambda: run_sources(after_nvml, Cycle())

    mig = next(s for s in with_pods_sources.fast if s.name == "nvml_mig")
    variants: dict[str, Callable[[], object]] = {
        "attribution, processes only": sources(without_sources),
        "attribution, processes + pod-resources": sources(with_pods_sources),
        "slow cycle, processes only": without.slow_cycle,
        "slow cycle, processes + pod-resources": with_pods.slow_cycle,
        "fast cycle MIG source (28 instances)": lambda: mig.collect(Cycle()),
    }
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    wall: dict[str, list[float]] = {k: [] for k in variants}
    order = list(variants)
    rng = random.Random(1)
    for _ in range(rounds):
        clock.advance(1.0)
        rng.shuffle(order)
        for name in order:
            c, w = _timed(variants[name])
            cpu[name].append(c)
            wall[name].append(w)

    poll_rows = []
    poll_rounds = max(5, rounds // 8)
    for extra in (0, 100, 1000):
        kubelet.pods = _kubelet_pods(sim, extra)
        client.poll()
        pc, pw = [], []
        for _ in range(poll_rounds):
            c, w = _timed(client.poll)
            pc.append(c)
            pw.append(w)
        snap = client.snapshot()
        assert snap is not None and len(snap.allocations) == 32
        poll_rows.append((f"{32 + extra} pods (32 with a GPU or slice)", *_stats(pc), *_stats(pw)))

    # Paired per round (both ran in the same round, in shuffled order): the machine's drift cancels.
    paired = [w - o for w, o in zip(cpu["attribution, processes + pod-resources"],
                                    cpu["attribution, processes only"], strict=True)]
    added, added_lo, added_hi = _bench.quantile(paired, 0.5), _bench.quantile(paired, 0.25), \
        _bench.quantile(paired, 0.75)
    table = _bench.md_table(
        ["per sample cycle", "CPU min", "CPU median", "CPU p90", "wall min", "wall median", "wall p90"],
        [(name, *_stats(cpu[name]), *_stats(wall[name])) for name in variants])
    polls = _bench.md_table(
        ["one List call (poller thread)", "CPU min", "CPU median", "CPU p90", "wall min", "wall median",
         "wall p90"], poll_rows)
    parts = [
        "# Pod attribution: cost per sample cycle" + (" (quick run: do not quote)" if args.quick else ""),
        "",
        _bench.machine_block({"rounds": str(rounds), "grpcio": _bench._version("grpcio"),  # noqa: SLF001
                              "protobuf": _bench._version("protobuf")}),  # noqa: SLF001
        "",
        f"{GPUS} simulated H100s, {MIG_GPUS} of them in MIG mode with {SLICES} × 1g.10gb: "
        f"{GPUS - MIG_GPUS + MIG_GPUS * SLICES} devices, one process and one pod each. CPU is this thread's "
        "time (`time.thread_time`); wall includes the shared machine's noise.",
        "",
        "## In the sample cycle (every `sampling.slow_interval_s`, 30 s by default)",
        "",
        table,
        "",
        f"Pod-resources adds **{_bench.fmt_us(added)}** of CPU to a slow cycle's attribution for 32 devices "
        f"(median of the per-round differences; quartiles {_bench.fmt_us(added_lo)} to "
        f"{_bench.fmt_us(added_hi)}): mapping the kept answer to this node's UUIDs and labelling the rows. "
        "The sample cycle never calls the kubelet; it reads the poller's last answer.",
        "",
        "## Off the sampling path (the poller's thread, every `jobs.pod_resources.interval_s`, 10 s)",
        "",
        polls,
        "",
        "CPU is the calling thread's only (the decode into Python objects and the allocation list); gRPC's "
        "own I/O threads and the kubelet stand-in (in Python, on the same 2 CPUs) are in the wall time. "
        "A real kubelet answers in Go. A slow or absent kubelet costs the poller its `timeout_s`, never a "
        "sample (tests/contract/test_pod_attribution.py holds a call open while the slow cycle runs).",
    ]
    _bench.write_result("pod_attribution", "\n".join(parts), quick=args.quick)
    return 0


def _stats(xs: list[float]) -> tuple[str, str, str]:
    lo, med, p90 = _bench.spread(xs)
    return _bench.fmt_us(lo), _bench.fmt_us(med), _bench.fmt_us(p90)


if __name__ == "__main__":
    sys.exit(main())
