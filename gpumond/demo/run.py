"""Runs the demo and tells its story: what is planted, what fires as it happens, and a closing summary."""

from __future__ import annotations

import secrets
import shutil
import signal
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gpumond.demo.cluster import AgentProcess, RulesProcess, StartError
from gpumond.demo.job import ClockFactors, SimulatedJob
from gpumond.demo.pages import Pages
from gpumond.demo.plan import GPUS_PER_NODE, JOB, DemoPlan
from gpumond.demo.story import Event, Timeline, complete, outcomes, render_event, render_summary, waiting_for
from gpumond.demo.watch import Roster, Watch

Say = Callable[[str], None]

QUIET_S = 15.0  # after this long with nothing new, say what the demo still waits for
POLL_S = 1.0
WIDTH = 110  # wrap long prose lines (event lines are left whole: they are grepped)
EXIT_NOT_FOUND = 1
EXIT_START_FAILED = 1
EXIT_INTERRUPTED = 130


class _Teller:
    """Prints with the demo clock, whose stamps never go backwards; serialised, since a receiver thread may record
    events too."""

    def __init__(self, say: Say, t0: float) -> None:
        self._say = say
        self._t0 = t0
        self._lock = threading.Lock()
        self._shown = 0.0  # the latest stamp printed
        self.last_news = 0.0

    def now(self) -> float:
        return time.monotonic() - self._t0

    def _stamp(self, t_s: float) -> str:
        # An event is printed when it is known, which can be after one that happened later (a page held until
        # the watcher sees its finding): it takes the later stamp, and its own time is said on its line.
        self._shown = max(self._shown, t_s)
        return f"[{self._shown:6.1f}s]"

    def line(self, text: str = "", *, stamp: bool = True) -> None:
        with self._lock:
            self._say(f"{self._stamp(self.now())} {text}" if stamp else text)

    def event(self, lines: list[str], t_s: float) -> None:
        with self._lock:
            stamp = self._stamp(t_s)
            late = f"  (at {t_s:.1f}s)" if self._shown - t_s >= 0.05 else ""
            self._say(f"{stamp} {lines[0]}{late}")
            for extra in lines[1:]:
                self._say(" " * 10 + extra)
            self.last_news = t_s


def _plan_lines(plan: DemoPlan) -> list[str]:
    out = ["Planted (times in seconds from the start):"]
    width = max(len(str(f.place)) for f in plan.faults())
    indent = " " * (2 + 8 + 1 + width + 2)
    for f in plan.faults():
        out.append(f"  {f.key:8s} {str(f.place):{width}s}  {f.what}")
        out += textwrap.wrap(f"expect: {f.hint}", WIDTH, initial_indent=indent, subsequent_indent=indent + "  ")
    return out


def _where_lines(rules: RulesProcess, agents: list[AgentProcess], workdir: Path, keep: bool, *,
                 live: bool) -> list[str]:
    when = "while the demo runs" if live else "(these served while the demo ran; each run picks new ports)"
    out = [f"Where to look {when}:",
           f"  findings   gpumond findings --url {rules.url}   (JSON: {rules.url}/api/v1/findings)"]
    out += [f"  agent      {a.name}  {a.url}/metrics" for a in agents]
    files = "per node: agent.log, agent.yaml, scenario.yaml, state/policy-audit.jsonl; rules/ alert state"
    if keep:
        out.append(f"  logs       {workdir}/  (kept; {files})")
    elif live:
        out.append(f"  logs       {workdir}/  ({files}; deleted at the end unless --keep)")
    else:
        out.append(f"  logs       deleted ({workdir}/): run with --keep to keep them ({files})")
    return out


def run_demo(plan: DemoPlan, *, duration_s: float, speed: float, say: Say = print, keep: bool = False,
             pages: Pages | None = None) -> int:
    """Run the demo until every planted fault is found and resolved, `duration_s` passes, or SIGINT/SIGTERM.

    Returns 0 when every planted fault was found, 1 when one was missed or a part did not start (one line
    says which, and the logs are kept), 130 when interrupted.
    """
    workdir = Path(tempfile.mkdtemp(prefix="gpumond-demo-"))
    t0 = time.monotonic()
    tell = _Teller(say, t0)
    faults = plan.faults()

    def show(e: Event) -> None:
        # A pending finding nobody planted is news only if it fires; the summary counts those that never did.
        if e.fault is None and e.state in ("pending", "dropped"):
            return
        tell.event(render_event(e, faults), e.t_s)

    # Everything observed goes through this one timeline, from any thread: the watcher's findings, alerts and
    # policy actions now; a notification receiver's pages join it as Event(kind="page", ...) via timeline.record.
    timeline = Timeline(faults, on_event=show)

    stop = threading.Event()
    interrupted = threading.Event()

    def on_signal(*_: object) -> None:
        interrupted.set()
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    agents: list[AgentProcess] = []
    job: SimulatedJob | None = None
    rules: RulesProcess | None = None
    ended = f"--duration {duration_s:g} s reached"
    pages = pages if pages is not None else Pages()
    try:
        pages.start()
        alerting = pages.alerting()
        agents = [AgentProcess(plan, i, workdir, speed, alerting) for i in range(plan.nodes)]
        tell.line(f"gpumond demo: {plan.nodes} simulated nodes × {GPUS_PER_NODE} GPUs (speed ×{speed:g}), "
                  f"the rules service, and a {plan.nodes * GPUS_PER_NODE}-rank training job {JOB}.")
        tell.line(f"It ends when every planted fault is found and resolved, or after {duration_s:.0f} s "
                  f"(--duration); Ctrl-C ends it early. Either way it closes with a summary.", stamp=False)
        tell.line(f"The agents' power policy enforces here (policy: {{mode: {plan.policy_mode}}}: the GPUs are "
                  "simulated); an agent you install defaults to dry_run and changes no limit until told so.",
                  stamp=False)
        last = max(f.start_s for f in plan.faults())
        if duration_s < last + 30:
            tell.line(f"--duration {duration_s:.0f} s is short: the last fault is planted at {last:.0f} s and takes "
                      f"up to ~30 s to be found; give --duration {last + 60:.0f} or more to see everything.",
                      stamp=False)
        tell.line("", stamp=False)
        for text in _plan_lines(plan):
            tell.line(text, stamp=False)
        tell.line("", stamp=False)
        for a in agents:
            a.wait_ready(time.monotonic() + 60)
        roster = Roster.from_gpu_info((a.name, a.metrics()) for a in agents)
        token = secrets.token_hex(16)
        rules = RulesProcess(agents, token, workdir, alerting)
        rules.wait_ready(time.monotonic() + 30)
        for text in _where_lines(rules, agents, workdir, keep, live=True):
            tell.line(text, stamp=False)
        for text in pages.lines():
            tell.line(text, stamp=False)
        tell.line("", stamp=False)
        pages.follow(timeline.record, lambda labels: roster.place(
            node=labels.get("node"), gpu=int(labels["gpu"]) if labels.get("gpu", "").isdigit() else None,
            rank=int(labels["rank"]) if labels.get("rank", "").isdigit() else None, uuid=labels.get("uuid")),
            tell.now, [rules.url] + [a.url for a in agents])

        starved_rank = plan.rank_of(plan.starved_node, plan.starved_gpu)
        starve = (t0 + plan.starved_at_s, t0 + plan.starved_end_s)
        wait_s = plan.data_wait_s()

        def data_wait(rank: int) -> float:
            return wait_s if rank == starved_rank and starve[0] <= time.monotonic() < starve[1] else 0.0

        factors = ClockFactors()

        def foreign(job_id: str) -> None:
            tell.line(f"note: the rules service also holds job {job_id!r}: something else on this machine pushes "
                      f"to {rules.url}; the demo ignores it")

        watch = Watch([(a.name, a.metrics) for a in agents], rules.service.evaluator.findings, JOB, roster,
                      factors, timeline.record, on_foreign_job=foreign, speed=speed,
                      drains=lambda: rules.service.remediator.state.records)
        job = SimulatedJob(job=JOB, ranks=list(roster.ranks), endpoint=rules.url, token=token,
                           step_s=plan.step_s, clock_factors=factors, data_wait=data_wait)
        tell.line(f"agents up, rules service up; job {JOB} starts training: {len(roster.ranks)} ranks in lockstep, "
                  "pushing step times through gpumond.job")
        watch.poll(tell.now())
        job.start()
        tell.last_news = tell.now()
        last_wait_line = tell.now()
        while not stop.is_set():
            now = tell.now()
            if now >= duration_s:
                break
            watch.poll(now)
            events = timeline.events
            if complete(faults, events, now):
                ended = "everything planted was found and has resolved"
                tell.line(f"{ended}: ending early")
                break
            quiet = now - max(tell.last_news, last_wait_line)
            if quiet >= QUIET_S:
                left = " | ".join(waiting_for(faults, events, now))
                tell.line(f"waiting for: {left} — at most {duration_s - now:.0f} s left")
                last_wait_line = now
            stop.wait(POLL_S)
        if interrupted.is_set():
            ended = "interrupted"
        timeline.flush()  # pages whose finding the watcher never saw fire are still shown before the summary
        now = tell.now()
        events = timeline.events
        say("")
        say(f"Summary after {now:.0f} s ({ended}):")
        say(render_summary(faults, events, now))
        say("")
        for text in _where_lines(rules, agents, workdir, keep, live=False):
            say(text)
        if interrupted.is_set():
            return EXIT_INTERRUPTED
        return 0 if all(o.found for o in outcomes(faults, events)) else EXIT_NOT_FOUND
    except StartError as e:
        keep = True  # the logs are how to find out why
        print(f"gpumond demo: {e} (logs kept in {workdir})", file=sys.stderr)
        return EXIT_START_FAILED
    finally:
        if job is not None:
            job.stop()
        if rules is not None:
            rules.stop()
        for a in agents:
            a.stop()
        pages.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)

