"""The GPU field check: gpumond's NVML, GPM and CUDA paths against a real driver, in one command under 8 minutes.

    python benchmarks/gpu_field_check.py --out gpu_field_check.md        # on a machine with NVIDIA GPUs
    python benchmarks/gpu_field_check.py --sim --out /tmp/check.md       # here, against the simulated NVML

What it does, in order (docs/gpu-field-check.md has the why and how to prepare a machine with no network):
1. `gpumond agent` on the real driver (`policy: {mode: dry_run}`): every reading it exports that nvidia-smi also
   shows (`--query-gpu`, the fields this driver knows) compared over paired reads with a stated tolerance; the
   GPU's identity; ECC mode against the ECC series; what the agent logged as unsupported; the exposition
   through `promtool check metrics` (or prometheus-client's parser); the agent's CPU per series scraped.
2. GPM under three loads it runs itself (benchmarks/_field_loads.py): idle, a one-block kernel back to back
   (busy but doing little), an 8192² bf16 matmul loop; the expected ordering of SM, occupancy, tensor and
   DRAM activity, and the NVLink series or why there are none.
3. The job SDK on CUDA and the whole path: `gpumond rules` scraping that agent, and a torchrun job of
   `--world` gloo ranks on the one GPU (benchmarks/ddp_job.py --device cuda, instrument() on DDP), one rank
   `--slow-factor` slow in GPU time; each rank's CUDA-event comm wait, and the finding naming the slow rank.
4. CUDA only: the synchronising CUDA runtime calls over the same steps with and without instrument(),
   counted by torch's profiler.
It writes nothing to a GPU: no power limit, clock, MIG, persistence or ECC setting (nvidia-smi's view of those
is compared before and after), and exits 1 when any comparison fails.

With --sim the same steps run against `gpumond agent --sim 3` (benchmarks/field_check_sim.yaml: one simulated
GPU per load) and a simulated nvidia-smi reading the same simulated node (gpumond/nvml/sim/nvidia_smi.py); the
loads and the job run on the CPU (ddp_job.py's host-side device time), and step 4 is skipped: it proves the
script, not the hardware (tests/integration/test_gpu_field_check.py).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))
import _bench  # noqa: E402
import _field_compare as fc  # noqa: E402
import ddp_e2e  # noqa: E402

NODE = "field-node"
SIM_SCENARIO = HERE / "field_check_sim.yaml"
SIM_GPUS = 3
SIM_LOAD_GPU = {"idle": 0, "tiny": 1, "matmul": 2}  # the scenario's GPU standing in for each load
SLOW_RANK = 1
PHASES = ("driver", "gpm", "job", "fsdp")
LOAD_READY_S = 120.0
# The job: device time dominates the step, so the slow rank's extra GPU time is what the others wait for.
JOB_ARGS = ["--batch", "32", "--dim", "64", "--width", "256", "--depth", "4", "--bucket-mb", "0.1"]


class Smi:
    """nvidia-smi (or the simulated one): the three forms the check uses."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = list(argv)

    def run(self, *args: str) -> str:
        p = subprocess.run([*self.argv, *args], capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(self.argv[-1:] + list(args))} exited {p.returncode}: "
                               f"{(p.stdout + p.stderr).strip()[-500:]}")
        return p.stdout

    def query(self, fields: Sequence[str]) -> dict[int, dict[str, str | None]]:
        out = self.run(f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits")
        return fc.parse_smi_csv(out, fields)


def scrape(url: str) -> tuple[str, fc.Scrape]:
    text = _bench.fetch(url).decode()
    return text, fc.parse_scrape(text)


def exposition_check(text: str) -> fc.Check:
    """promtool's lint when it is installed, else prometheus-client's parser (which parse_scrape already ran)."""
    if shutil.which("promtool") is None:
        return fc.Check("driver", "exposition", True, "parsed by prometheus-client (promtool not installed)")
    p = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    return fc.Check("driver", "exposition", p.returncode == 0,
                    "`promtool check metrics` clean" if p.returncode == 0 else (p.stdout + p.stderr).strip()[:400])


def scrape_cpu(agent: _bench.Proc, url: str, series: int, scrapes: int = 40) -> fc.Check:
    """The agent's CPU per series served: CPU over back-to-back scrapes less its CPU while not scraped."""
    c0, t0 = _bench.proc_cpu_s(agent.pid), time.monotonic()
    time.sleep(2.0)
    idle_rate = (_bench.proc_cpu_s(agent.pid) - c0) / (time.monotonic() - t0)
    c1, t1 = _bench.proc_cpu_s(agent.pid), time.monotonic()
    for _ in range(scrapes):
        _bench.fetch(url)
    cpu = _bench.proc_cpu_s(agent.pid) - c1 - idle_rate * (time.monotonic() - t1)
    per = max(cpu, 0.0) / scrapes
    return fc.Check("driver", "scrape CPU", None, f"{per * 1e3:.2f} ms per scrape of {series} series = "
                    f"{per / series * 1e6:.2f} µs per series ({scrapes} scrapes, CPU clock ticks of "
                    f"{1 / _bench.CLK_TCK * 1e3:.0f} ms; agent's own sampling subtracted)")


def driver_phase(smi: Smi, fields: list[str], url: str, agent: _bench.Proc, pairs: int
                 ) -> tuple[list[fc.Check], fc.Scrape, list[str]]:
    reads = []
    for _ in range(pairs):
        row = smi.query(fields)
        reads.append((row, scrape(url)[1]))
        time.sleep(0.5)
    text, last = scrape(url)
    checks = [*fc.compare_identity(reads[-1][0], reads[-1][1]), *fc.compare_readings(reads),
              *fc.compare_ecc_mode(reads[-1][0], reads[-1][1]), *fc.compare_clock_events(reads),
              exposition_check(text), scrape_cpu(agent, url, last.series), fc.nvml_errors(last)]
    unsupported = [f"GPU {g}: {reader} (`{call}`: {err})" for g, reader, call, err in
                   fc.unsupported_from_log(agent.log.read_text(errors="replace"))]
    return checks, last, unsupported


def gpm_phase(url: str, device: str, load_gpu: dict[str, int], seconds: float, workdir: Path,
              gpu_env: dict[str, str]) -> tuple[list[fc.Check], dict[str, dict[str, float | None]], fc.Scrape]:
    # On the CPU (--sim) the stand-in loads have no steady state to reach.
    warmup = "2" if device == "cuda" else "0.1"
    said = workdir / "loads.out"
    with open(said, "w") as out, open(workdir / "loads.log", "w") as err:
        loads = subprocess.Popen([sys.executable, str(HERE / "_field_loads.py"), "--device", device,
                                  "--warmup-s", warmup], stdin=subprocess.PIPE, stdout=out, stderr=err, text=True,
                                 env={**os.environ, "PYTHONPATH": _bench.pythonpath(), **gpu_env})
    assert loads.stdin is not None
    figures: dict[str, dict[str, float | None]] = {}
    last = None
    try:
        for load in fc.LOADS:
            loads.stdin.write(load + "\n")
            loads.stdin.flush()
            # Torch's import and the GPU's first use come before the first `ready`: a generous bound.
            _bench.wait_for(lambda load=load: _ready(said, load, loads), LOAD_READY_S, f"the {load} load to run")
            scrapes = []
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                time.sleep(1.0)  # the agent's fast interval: one GPM interval per scrape
                scrapes.append(scrape(url)[1])
            figures[load] = fc.gpm_figures(scrapes, load_gpu[load])
            last = scrapes[-1]
        loads.stdin.write("stop\n")
        loads.stdin.flush()
        loads.wait(60)
    finally:
        if loads.poll() is None:
            loads.kill()
            loads.wait(10)
    assert last is not None
    return fc.gpm_checks(figures), figures, last


def _ready(said: Path, load: str, proc: subprocess.Popen[str]) -> bool:
    if f"ready {load}\n" in said.read_text():  # each load is asked for once, and answered once
        return True
    if proc.poll() is not None:
        raise RuntimeError(f"the load process exited ({proc.returncode}) before {load}: "
                           f"{(said.parent / 'loads.log').read_text(errors='replace')[-500:]}")
    return False


def read_waits(record: Path) -> dict[int, list[float]]:
    waits = {}
    for f in sorted(record.glob("rank*.waits.jsonl")):
        rank = int(re.search(r"rank(\d+)", f.name).group(1))  # type: ignore[union-attr]
        waits[rank] = [json.loads(line)["exposed_s"] for line in f.read_text().splitlines() if line.strip()]
    return waits


def job_phase(target: str, uuid: str, device: str, world: int, factor: float, seconds: float,
              evaluation_s: float, workdir: Path, gpu_env: dict[str, str]) -> tuple[list[fc.Check], str]:
    record = workdir / "waits"
    planted = (["--slow-rank", str(SLOW_RANK), "--slow-factor", f"{factor:g}"], (("straggler", SLOW_RANK),))
    out = ddp_e2e.run_case("field", workdir / "path", duration_s=seconds, settle_s=3.0, evaluation_s=evaluation_s,
                           world=world, agent=(target, [uuid] * world), node=NODE, planted=planted, job_env=gpu_env,
                           job_args=[*JOB_ARGS, "--device-ms", "10" if device == "cuda" else "30",
                                     "--device", device, "--record", str(record)])
    checks = [fc.separation_check(read_waits(record), SLOW_RANK),
              fc.findings_check(out.seen, out.unexpected(), SLOW_RANK)]
    setup = (f"{world} ranks of benchmarks/ddp_job.py --device {device} on GPU UUID {uuid}, rank {SLOW_RANK} "
             f"{factor:g}× device time; `gpumond rules` scraping the agent, evaluation every {evaluation_s:g} s; "
             f"first step {out.started or 0:.1f} s after launch, ran {out.ran_s} s")
    return checks, setup


def sync_phase(device: str, workdir: Path, left_s: float, gpu_env: dict[str, str], steps: int = 20) -> fc.Check:
    if device != "cuda":
        return fc.Check("job", "no host synchronisation added", None, "skipped: no CUDA here (--sim)")
    if left_s < 90:
        return fc.Check("job", "no host synchronisation added", False, f"not run: {left_s:.0f} s of the budget left")
    counts = {}
    for hook in (True, False):
        record = workdir / f"syncs-{'with' if hook else 'without'}"
        _bench.torchrun(HERE / "ddp_job.py", 2, [*JOB_ARGS, "--device-ms", "10", "--device", "cuda", "--steps",
                                                  str(steps + 5), "--warmup", "10", "--count-syncs", str(steps),
                                                  "--out", str(record / "out"), "--record", str(record),
                                                  *([] if hook else ["--no-hook"])], env=gpu_env,
                        timeout_s=left_s / 2 - 5)
        counts[hook] = json.loads((record / "rank0.syncs.json").read_text())["counts"]
    return fc.sync_check(counts[True], counts[False], steps)


def fsdp_phase(device: str, factor: float, workdir: Path, left_s: float, gpu_env: dict[str, str]
               ) -> tuple[list[fc.Check], str]:
    """FSDP2 (fully_shard) on 2 gloo ranks, rank 1 `factor` slow: its forward all-gather wait is the least."""
    name = "FSDP2: forward all-gather wait separates the slow rank"
    if left_s < 60:
        raise RuntimeError(f"not run: {left_s:.0f} s of the budget left")
    out = workdir / "fsdp"
    out.mkdir()
    # On the CPU (--sim) a busy 2-core machine adds milliseconds of jitter: a longer step keeps the 1.3× gap above it.
    steps, device_ms = (20, 30) if device == "cuda" else (12, 40)
    setup = (f"benchmarks/fsdp_signal.py's worker, 2 ranks --device {device}, {steps} steps of {device_ms} ms device "
             f"time, rank {SLOW_RANK} {factor:g}×; medians after its warm-up steps")
    try:
        _bench.torchrun(HERE / "fsdp_signal.py", 2, ["--worker", str(out), "--factor", f"{factor:g}", "--device-ms",
                                                      str(device_ms), "--steps", str(steps), "--device", device],
                        env=gpu_env, timeout_s=min(180.0, left_s - 10))
    except RuntimeError as e:
        if device != "cuda":
            raise
        # FSDP2's collectives over gloo on CUDA tensors are gloo's to support (NCCL needs a GPU per rank): a refusal
        # is reported, not counted against gpumond; the error says which.
        return [fc.Check("fsdp", name, None, f"did not run: {_error_line(str(e))}")], setup
    waits = {r: json.loads((out / f"rank-{r}.json").read_text())["waits"] for r in (0, 1)}
    return [fc.separation_check(waits, SLOW_RANK, name)], setup


def main() -> int:
    ap = _bench.parser(__doc__, "shorter phases")
    ap.add_argument("--sim", action="store_true", help="run against `gpumond agent --sim 3` and a simulated nvidia-smi")
    ap.add_argument("--out", type=Path, default=_bench.RESULTS / "gpu_field_check.md", help="the Markdown result")
    ap.add_argument("--gpu", type=int, default=0, help="the GPU the loads and the job use (default 0)")
    ap.add_argument("--world", type=int, default=4,
                    help="ranks of the job (default 4: the detectors compare a rank with at least 4 peers)")
    ap.add_argument("--slow-factor", type=float, default=1.3, help="the slow rank's device time × (default 1.3)")
    ap.add_argument("--pairs", type=int, default=5, help="paired nvidia-smi / agent reads (default 5)")
    ap.add_argument("--load-s", type=float, help="seconds of GPM reads per load (default 6, --quick 3)")
    ap.add_argument("--job-s", type=float, help="seconds the job trains at most (default 90, --quick 45)")
    ap.add_argument("--evaluation", type=float, default=float(ddp_e2e.EVALUATION_S),
                    help="the rules service's evaluation_interval_s (default: the service's)")
    ap.add_argument("--budget-s", type=float, default=480.0,
                    help="the whole check's time limit (default 480: 8 minutes); the job trains for what is left")
    ap.add_argument("--phases", default=",".join(PHASES),
                    help=f"which phases to run (default all: {','.join(PHASES)}); the settings check always runs")
    ap.add_argument("--nvidia-smi", help="the nvidia-smi command (default: nvidia-smi; with --sim the simulated one)")
    a = ap.parse_args()
    load_s = a.load_s or (3.0 if a.quick else 6.0)
    job_s = a.job_s or (45.0 if a.quick else 90.0)
    device = "cpu" if a.sim else "cuda"
    sim_args = ["--sim", str(SIM_GPUS), "--sim-scenario", str(SIM_SCENARIO), "--node-name", NODE]
    smi = Smi(shlex.split(a.nvidia_smi) if a.nvidia_smi else
              [sys.executable, "-m", "gpumond.nvml.sim.nvidia_smi", *sim_args] if a.sim else ["nvidia-smi"])
    load_gpu = dict(SIM_LOAD_GPU) if a.sim else dict.fromkeys(fc.LOADS, a.gpu)
    job_gpu = SIM_LOAD_GPU["matmul"] if a.sim else a.gpu
    phases = set(a.phases.split(","))
    if phases - set(PHASES):
        ap.error(f"--phases: unknown {', '.join(sorted(phases - set(PHASES)))} (choose from {', '.join(PHASES)})")
    started = time.monotonic()

    def left() -> float:
        return a.budget_s - (time.monotonic() - started)
    checks: list[fc.Check] = []
    sections: list[str] = []

    try:
        fields, unknown = fc.usable_fields(smi.run("--help-query-gpu"), fc.wanted_fields())
        before = smi.query(fields)
        banner = smi.run()
    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as e:
        print(f"gpu_field_check: nvidia-smi does not answer ({str(e).splitlines()[0]}): this check needs a machine "
              f"with NVIDIA GPUs and their driver; without one, run it against the simulator with --sim",
              file=sys.stderr)
        return 2
    if not before:
        print("gpu_field_check: nvidia-smi lists no GPU; nothing to check", file=sys.stderr)
        return 2
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", banner)
    facts = {
        "mode": "SIMULATED (--sim): the script proven, not the hardware" if a.sim else "real driver",
        "GPUs": "; ".join(f"{g}: {r.get('name')} {r.get('uuid')} {r.get('pci.bus_id')}"
                          for g, r in sorted(before.items())),
        "driver": next(iter(before.values()), {}).get("driver_version") or "unknown",
        "CUDA (driver)": cuda.group(1) if cuda else "unknown",
        "torch": _torch_version(),
        "nvidia-smi fields this driver lacks": ", ".join(unknown) or "none",
    }

    def phase(name: str, title: str, run: Callable[[], tuple[list[fc.Check], str]], logs: Sequence[Path]) -> None:
        """Run one phase; an exception is its failure, written into the result with the logs' tails."""
        if name not in phases:
            return
        try:
            got, text = run()
        except Exception as e:  # the result must be written whatever broke: it is what the session brings back
            got = [fc.Check(name, f"{name} phase ran", False, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")]
            text = "\n\n".join(f"`{p.name}` (tail):\n\n```\n{_tail(p)}\n```" for p in logs if p.exists())
        checks.extend(got)
        sections.append(f"## {title}\n\n" + (text + "\n\n" if text else "") + fc.checks_table(got))
        print(f"… {name} done at {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)

    # The loads and the job see only the checked GPU, named by UUID: CUDA's own device order (fastest first) need
    # not be NVML's index order.
    gpu_env = {} if a.sim else {"CUDA_VISIBLE_DEVICES": (before.get(a.gpu) or {}).get("uuid") or str(a.gpu)}
    with tempfile.TemporaryDirectory(prefix="gpumond-field-") as tmp:
        workdir = Path(tmp)
        port = _bench.free_port()
        (workdir / "agent.yaml").write_text(json.dumps({
            "state_dir": str(workdir / "agent-state"), "node_name": NODE, "policy": {"mode": "dry_run"},
            "sampling": {"fast_interval_s": 1.0}}))
        agent = _bench.Proc("agent", [sys.executable, "-m", "gpumond.cli", "agent", *(sim_args[:4] if a.sim else []),
                                      "--listen", f"127.0.0.1:{port}", "--config", str(workdir / "agent.yaml")],
                            workdir / "agent.log").start()
        url = f"http://127.0.0.1:{port}/metrics"
        final: fc.Scrape | None = None
        try:
            # GPM reports rates between two samples: its series appear from the second fast cycle (Hopper and
            # later; on an older GPU they never do, and the check goes on after 20 s to report them absent).
            _bench.wait_for(lambda: "gpumond_gpu_sm_active_ratio" in (text := _bench.fetch(url).decode())
                            or time.monotonic() - agent.started_at > 20 and "gpumond_gpu_up" in text,
                            60, "the agent's first GPM interval", agent)

            def driver() -> tuple[list[fc.Check], str]:
                got, last, unsupported = driver_phase(smi, fields, url, agent, a.pairs)
                return got, ("Shown by nvidia-smi, not exported by the agent: " + fc.driver_only(before) + "\n\n"
                             + "Exported with no nvidia-smi `--query-gpu` field to compare: "
                             + ", ".join(f"`{n}`" for n in fc.not_compared(last))
                             + "\n\nNVML calls the agent logged as unsupported: " + ("; ".join(unsupported) or "none"))

            def gpm() -> tuple[list[fc.Check], str]:
                got, figures, last = gpm_phase(url, device, load_gpu, load_s, workdir, gpu_env)
                got.append(fc.nvlink_check(last, job_gpu))
                rows = [[load, load_gpu[load], *(_fmt(figures[load].get(k)) for k in fc.GPM)] for load in fc.LOADS]
                return got, (_bench.md_table(["load", "GPU", *fc.GPM], rows)
                             + f"\n\nMedians over {load_s:g} s of 1 s agent intervals per load.")

            def job() -> tuple[list[fc.Check], str]:
                uuid = (scrape(url)[1].info.get(job_gpu) or {}).get("uuid", "")
                # What the job may train for: the budget less the sync count's two short runs and FSDP2's one
                # (~2 min on a GPU), and the job's own start-up and shut-down.
                train_s = min(job_s, left() - (90 if a.sim else 210) - 90)
                if train_s < 20:
                    raise RuntimeError(f"not run: {left():.0f} s of the {a.budget_s:g} s budget left")
                got, setup = job_phase(f"127.0.0.1:{port}", uuid, device, a.world, a.slow_factor, train_s,
                                       a.evaluation, workdir, gpu_env)
                return [*got, sync_phase(device, workdir, left() - 20, gpu_env)], setup

            phase("driver", "1. The agent against the driver", driver, [workdir / "agent.log"])
            phase("gpm", "2. GPM under the check's own loads", gpm, [workdir / "loads.log", workdir / "agent.log"])
            phase("job", "3. The job SDK and the whole path", job,
                  [workdir / "path" / "job.log", workdir / "path" / "rules.log"])
            phase("fsdp", "3b. FSDP2", lambda: fsdp_phase(device, a.slow_factor, workdir, left() - 30, gpu_env), [])
            final = scrape(url)[1]
        finally:
            agent.terminate(30)
        after = smi.query(fields)
        got = [*fc.settings_unchanged(before, after), *(fc.policy_acted(final) if final is not None else [])]
        checks += got
        sections.append("## 4. Nothing changed\n\n" + fc.checks_table(got))
    bad = fc.failed(checks)
    facts["took"] = f"{time.monotonic() - started:.0f} s"
    facts["verdict"] = (f"{len(bad)} of {sum(c.ok is not None for c in checks)} comparisons failed" if bad
                        else f"all {sum(c.ok is not None for c in checks)} comparisons passed")
    text = "\n\n".join(["# GPU field check" + (" (simulated)" if a.sim else ""), _bench.machine_block(facts),
                        *sections])
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text.rstrip() + "\n")
    print(text)
    print(f"\n(written to {a.out})")
    return 1 if bad else 0


def _error_line(output: str) -> str:
    """The child's own exception line from a torchrun failure (torchrun's summary names only its ChildFailedError)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"[A-Za-z_.]*(Error|Exception)\b", ln) and "ChildFailedError" not in ln]
    return (errors or lines or ["no output"])[-1][:300]


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:].replace("`" * 3, "'" * 3)


def _fmt(v: float | None) -> str:
    return "absent" if v is None else f"{v:.3f}"


def _torch_version() -> str:
    try:
        import torch
    except ImportError:
        return "not installed"
    return f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})"


if __name__ == "__main__":
    sys.exit(main())
