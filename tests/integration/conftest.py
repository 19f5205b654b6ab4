"""Fixtures for integration tests: agents, a real Prometheus, promtool — all on 127.0.0.1.

Fixtures (function scope; everything they start is stopped at teardown):

- `start_agent(*args, name="agent", port=None, timeout=30) -> AgentProcess`: starts
  `python -m gpumond.cli agent ARGS --listen 127.0.0.1:<free port>` in tmp_path/<name>
  and waits until /healthz is 200.
- `start_prometheus(targets, name="prometheus", **kw) -> PrometheusServer`: a real
  Prometheus scraping `targets` ("127.0.0.1:PORT") every second, ready (/-/ready 200).
- `promtool`: path of the promtool binary (fails, never skips, when it is missing).
- `slurm` (module scope): a real Slurm on 127.0.0.1 with the test module's `NODES` in one partition;
  `fresh_slurm`: the same, every node idle again before the test.

Module-scoped setups build the same objects from `helpers` directly (see
test_agent_faults.py). Whatever the scope, a failed test gets the stdout/stderr of every
process that was running during it (or started for it) appended to its report, and any
process left running at the end of the session is stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from tests.integration import helpers
from tests.integration.helpers import REGISTRY, AgentProcess, PrometheusServer
from tests.scripted_receiver import ScriptedReceiver

_FIRST_PROC = pytest.StashKey[int]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_FIRST_PROC] = len(REGISTRY)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    first = item.stash.get(_FIRST_PROC, len(REGISTRY))
    for i, proc in enumerate(REGISTRY):
        if i >= first or proc.running:
            report.sections.append((f"{proc.label} #{i} output", proc.describe()))


def pytest_sessionfinish(session: pytest.Session) -> None:
    for proc in REGISTRY:  # the safety net; fixtures normally stopped them already
        if proc.running:
            proc.stop()


@pytest.fixture(params=["httptools", "h11"])
def http_parser(request: pytest.FixtureRequest) -> str:
    """Each of uvicorn's HTTP/1.1 protocols that the connection guard runs on (gpumond/web/protocols.py).
    httptools is a dependency: missing, the test fails (never skips), since the daemons would serve on h11."""
    import importlib.util

    if request.param == "httptools" and importlib.util.find_spec("httptools") is None:
        pytest.fail("httptools is not installed; it is a gpumond dependency: pip install -e '.[test]'", pytrace=False)
    return request.param


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator[Callable[..., AgentProcess]]:
    started: list[AgentProcess] = []

    def start(*args: str | Path, name: str = "agent", port: int | None = None,
              timeout: float = helpers.START_TIMEOUT_S) -> AgentProcess:
        agent = AgentProcess(list(args), tmp_path / name, port=port)
        started.append(agent)
        return agent.start(timeout)

    yield start
    for agent in started:
        if agent.proc is not None:
            agent.stop()


@pytest.fixture
def start_prometheus(tmp_path: Path) -> Iterator[Callable[..., PrometheusServer]]:
    started: list[PrometheusServer] = []

    def start(targets: Sequence[str], *, name: str = "prometheus", **kwargs: object) -> PrometheusServer:
        prom = PrometheusServer(targets, tmp_path / name, **kwargs)  # type: ignore[arg-type]
        started.append(prom)
        return prom.start()

    yield start
    for prom in started:
        if prom.proc is not None:
            prom.stop()


@pytest.fixture
def promtool() -> str:
    return helpers.require_binary("promtool")


@pytest.fixture
def receiver() -> Iterator[ScriptedReceiver]:
    """The demo's Slack / PagerDuty / Alertmanager-webhook receiver on 127.0.0.1, held to every rule the services
    document and scriptable to misbehave (tests/scripted_receiver.py)."""
    r = ScriptedReceiver().start()
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
def one_rank_group(tmp_path: Path) -> Iterator[None]:
    """torch.distributed on gloo with this process as the only rank (DDP and FSDP2 need a process group)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def slurm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from tests.integration.slurm_helpers import SlurmCluster

    with SlurmCluster(tmp_path_factory.mktemp("slurm"), request.module.NODES) as cluster:
        yield cluster


@pytest.fixture
def fresh_slurm(slurm: object) -> object:
    from tests.integration.slurm_helpers import all_idle

    return all_idle(slurm)  # type: ignore[arg-type]
