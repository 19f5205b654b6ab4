"""The benchmarks' one harness: start/stop processes, wait, measure (statistics, /proc), report (Markdown).

Not part of gpumond: the scripts next to this file import it as `_bench` (they put their own folder
on sys.path), so they run as plain `python benchmarks/<name>.py` from anywhere.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


# ----- statistics --------------------------------------------------------------------------------
def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of a non-empty sample (q in [0, 1])."""
    s = sorted(xs)
    if not s:
        raise ValueError("empty sample")
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def spread(xs: Sequence[float]) -> tuple[float, float, float]:
    """(min, median, p90)."""
    return min(xs), statistics.median(xs), quantile(xs, 0.9)


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept)."""
    n = len(xs)
    if n < 2:
        return 0.0, (ys[0] if ys else 0.0)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0, my
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return slope, my - slope * mx


# ----- formatting --------------------------------------------------------------------------------
def fmt_us(seconds: float) -> str:
    """Seconds as microseconds with 3 significant-ish digits."""
    us = seconds * 1e6
    if us >= 100:
        return f"{us:,.0f} µs"
    if us >= 10:
        return f"{us:.1f} µs"
    return f"{us:.2f} µs"


def accepted_steps(status: int, body: bytes, batch: bool) -> int:
    """The steps a push's answer says the rules service accepted (a relay's batch: over its pushes that were)."""
    if status != 202:
        return 0
    answer = json.loads(body)
    if batch:
        return sum(int(r.get("accepted", 0)) for r in answer["results"] if "status" not in r)
    return int(answer["accepted"])


def stop_workers(orders: Iterable[Any], procs: Iterable[Any], timeout_s: float = 30.0) -> None:
    """Tell worker processes to stop (a None on each order queue), wait for them, kill what is still alive."""
    for q in orders:
        q.put(None)
    for p in procs:
        p.join(timeout=timeout_s)
        if p.is_alive():
            p.kill()


def md_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub Markdown table; numbers right-aligned."""
    rows = [[str(c) for c in r] for r in rows]
    align = []
    for i, _ in enumerate(headers):
        numeric = rows and all(_looks_numeric(r[i]) for r in rows)
        align.append("---:" if numeric else "---")
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _looks_numeric(text: str) -> bool:
    t = text.replace(",", "").replace("×", "").replace("µs", "").replace("ms", "").replace("%", "").strip()
    t = t.split(" ")[0]
    try:
        float(t)
    except ValueError:
        return False
    return True


# ----- machine facts -----------------------------------------------------------------------------
def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git() -> str:
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "gpumond"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{' + uncommitted changes under gpumond/' if dirty else ''}" if head else "unknown"


def tool_version(exe: str) -> str:
    """The first line `exe --version` prints (stdout or stderr), or "unknown": for a result's machine block."""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
        return (out.stdout or out.stderr).splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def machine_block(extra: dict[str, str] | None = None) -> str:
    """A Markdown list stating the machine, the versions and the command, for every result file."""
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    facts = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{_cpu_model()}, {os.cpu_count()} CPUs, {mem_gib:.0f} GiB, "
                   f"Linux {platform.release()} ({'virtualised' if _hypervisor() else 'bare metal?'})",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "packages": ", ".join(f"{d} {_version(d)}" for d in (
            "gpumond", "nvidia-ml-py", "prometheus-client", "uvicorn", "h11", "httptools", "apscheduler",
            "psutil")),
        "gpumond tree": _git(),
        "command": " ".join(["python", *[_rel(a) for a in sys.argv]]),
    }
    facts.update(extra or {})
    return "\n".join(f"- **{k}**: {v}" for k, v in facts.items())


def _rel(arg: str) -> str:
    try:
        return str(Path(arg).resolve().relative_to(REPO))
    except ValueError:
        return arg


def _hypervisor() -> bool:
    try:
        return "hypervisor" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def write_result(name: str, text: str, *, quick: bool = False) -> Path:
    """Print the Markdown and write it to benchmarks/results/<name>.md (<name>_quick.md for a --quick run,
    which git ignores: a smoke run never overwrites a committed result)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}{'_quick' if quick else ''}.md"
    path.write_text(text.rstrip() + "\n")
    print(text)
    print(f"\n(written to {path.relative_to(REPO)})")
    return path


def parser(doc: str, quick: str) -> argparse.ArgumentParser:
    """The argument parser every benchmark starts from: its docstring's first line, and --quick saying what it runs."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"{quick}: a smoke test, numbers not meant to be quoted")
    return ap


def report(name: str, title: str, facts: dict[str, str], *sections: str, quick: bool = False) -> Path:
    """Write a benchmark's result: its title, the machine block with the run's own `facts`, then each section
    (tables, notes); a quick run says so in the title and goes to the git-ignored <name>_quick.md."""
    text = "\n\n".join([title + (" (quick: not for quoting)" if quick else ""), machine_block(facts), *sections])
    return write_result(name, text, quick=quick)


# ----- processes ---------------------------------------------------------------------------------
def free_port() -> int:
    """A free loopback TCP port: the demo's, the one definition outside the tests."""
    from gpumond.demo.cluster import free_port as demo_free_port

    return demo_free_port()


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a whole process (all threads), in seconds, from /proc/PID/stat."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2:].split()  # skip "pid (comm) "; fields[0] is field 3 (state)
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_status_kib(pid: int, key: str) -> int:
    """A 'kB' line of /proc/PID/status (VmRSS, VmHWM, …) in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def wait_http(url: str, timeout_s: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    """Wait until `url` answers 200, or fail naming the URL (and the process's exit status)."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server for {url} exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError as e:
            last = e
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f}s: {last}")


def fetch(url: str, gzip_ok: bool = False, timeout_s: float = 10.0) -> bytes:
    """GET a URL and return the raw (possibly gzipped) body."""
    req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"} if gzip_ok else {})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return r.read()


def start_rules(work: Path, tokens: Sequence[str], **config: object) -> tuple[Proc, str]:
    """A `gpumond rules` daemon (default config but `config`'s keys, these push tokens) on a free loopback port,
    started and answering; (its process, its base URL)."""
    port = free_port()
    path = work / "rules.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"listen": f"127.0.0.1:{port}", "tokens": list(tokens),
                                "state_dir": str(work / "rules-state"), **config}))
    rules = Proc("rules", [sys.executable, "-m", "gpumond.cli", "rules", "--config", str(path)],
                 work / "rules.log").start()
    wait_http(f"http://127.0.0.1:{port}/healthz", 60, rules.proc)
    return rules, f"http://127.0.0.1:{port}"


def count_series(text: bytes) -> int:
    """Samples in a Prometheus text exposition (non-empty, non-comment lines)."""
    return sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))


def stop(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGTERM a process we started, then SIGKILL it if it lingers."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)


def get_json(url: str, timeout_s: float = 10.0) -> Any:
    """GET a URL and decode its JSON body."""
    return json.loads(fetch(url, timeout_s=timeout_s))


def wait_for(probe: Callable[[], T], timeout_s: float, what: str, proc: Proc | None = None,
             interval_s: float = 0.2) -> T:
    """Poll `probe` until it returns something truthy (OSError/ValueError count as not yet); fail naming `what`,
    with the process's log tail when it exits first or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive:
            raise RuntimeError(f"{what}: {proc.name} exited ({proc.returncode})\n{proc.tail()}")
        try:
            got = probe()
            if got:
                return got
        except (OSError, ValueError):
            pass
        time.sleep(interval_s)
    raise RuntimeError(f"{what}: not within {timeout_s:g} s" + (f"\n{proc.tail()}" if proc is not None else ""))


def pythonpath() -> str:
    """The repository first, then whatever the caller had (on a machine without the packages installed, the
    folder their wheels were unpacked into: docs/gpu-field-check.md)."""
    caller = filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))
    return os.pathsep.join(dict.fromkeys([str(REPO), *caller]))


class Proc:
    """A child process a benchmark started: stdout and stderr in one log file, stopped by its own pid only.

    The repository is on its PYTHONPATH and the operator's alerting secrets are dropped from its environment,
    so a benchmark never pages anyone by accident.
    """

    SCRUBBED = ("GPUMOND_RULES_TOKENS", "GPUMOND_SLACK_WEBHOOK_URL", "GPUMOND_PAGERDUTY_ROUTING_KEY")

    def __init__(self, name: str, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
                 cwd: Path = REPO) -> None:
        self.name, self.argv, self.log, self.cwd = name, [str(a) for a in argv], log, cwd
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    def start(self) -> Proc:
        env = {k: v for k, v in os.environ.items() if k not in self.SCRUBBED}
        env.update({"PYTHONUNBUFFERED": "1", "PYTHONPATH": pythonpath(), **self.env})
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=self.cwd, env=env)
        self.started_at = time.time()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def kill(self, timeout_s: float = 30.0) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout_s)

    def terminate(self, timeout_s: float = 30.0) -> float | None:
        """SIGTERM; seconds until it exited, or None if it had to be SIGKILLed."""
        if not self.alive:
            return 0.0
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        return time.monotonic() - t0

    def wait_http(self, url: str, timeout_s: float = 40.0) -> float:
        """Wait for 200 from `url`; the wall time it first answered."""
        try:
            wait_http(url, timeout_s, self.proc)
        except RuntimeError as e:
            raise RuntimeError(f"{self.name}: {e}\n{self.tail()}") from None
        return time.time()

    def tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def torchrun(script: Path, world: int, args: Sequence[str], *, env: Mapping[str, str] | None = None,
             timeout_s: float | None = None) -> None:
    """Run `script` under torchrun (standalone, `world` processes on this host, one intra-op thread each);
    fail with the tail of its output rather than a bare exit status."""
    full_env = {**os.environ, "PYTHONPATH": pythonpath(), "OMP_NUM_THREADS": "1", **(env or {})}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
                        str(script), *args], env=full_env, capture_output=True, text=True,
                       timeout=timeout_s if timeout_s is not None and timeout_s < float("inf") else None)
    if p.returncode != 0:
        raise RuntimeError(f"torchrun {script.name} ({world} ranks) exited {p.returncode}:\n"
                           f"{(p.stdout + p.stderr)[-3000:]}")
