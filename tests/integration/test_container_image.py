"""The container image: built by scripts/build-image.sh with buildah, both daemons run from it, scraped from here.

The build is the documented one (`scripts/build-image.sh --local-base`): a Debian base made with mmdebstrap, a
wheelhouse made on this machine, `pip --no-index` inside the build. It runs once per module in a buildah storage of
its own that outlives the session (GPUMOND_TEST_BUILDAH_STORAGE, default ~/.cache/gpumond/test-buildah): the
Debian base (~2.5 min of mmdebstrap, and nothing of gpumond's) is made once per machine, as the script reuses a
base it finds; the wheelhouse and the image are made every time. GPUMOND_TEST_BUILDAH_STORAGE=tmp: a throwaway
storage, base included, removed after the module. Containers run with chroot isolation on the host's network, so
/metrics and /healthz are read from 127.0.0.1 as Prometheus would read them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import yaml

from gpumond import __version__
from tests.integration.helpers import (
    LOOPBACK, REPO_ROOT, ManagedProcess, free_port, http_get, parse_metrics, require_binary, wait_until,
)

pytestmark = pytest.mark.integration

# Measured on the 2-core test machine under load: base (mmdebstrap) ~130 s, wheelhouse ~100 s, image ~90 s.
BUILD_TIMEOUT_S = 900
NOBODY = 65534


@dataclass(frozen=True)
class BuiltImage:
    tag: str
    env: Mapping[str, str]  # the buildah storage and isolation every command against this image uses
    archive: Path
    build_s: float
    revision: str  # the commit checked out when the build started

    def buildah(self, *args: str, timeout: float = 120) -> str:
        p = subprocess.run(["buildah", *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        assert p.returncode == 0, f"buildah {' '.join(args)} exited {p.returncode}:\n{p.stderr[-3000:]}"
        return p.stdout


class ContainerProcess(ManagedProcess):
    """`buildah run --network host CONTAINER -- ARGV`: a daemon from the image, its ports on the host's loopback."""

    def __init__(self, image: BuiltImage, container: str, argv: Sequence[str], workdir: Path, *, label: str,
                 volumes: Sequence[str] = (), env: Mapping[str, str] | None = None) -> None:
        self.label = label
        flags = [f"--volume={v}" for v in volumes] + [f"--env={k}={v}" for k, v in (env or {}).items()]
        super().__init__(["buildah", "run", "--network", "host", *flags, container, "--", *argv], workdir,
                         env=image.env)

    def wait_healthy(self, base_url: str, timeout: float = 60) -> None:
        def healthy() -> bool:
            self._fail_if_exited(f"GET {base_url}/healthz to answer 200")
            return http_get(f"{base_url}/healthz", timeout=1.0)[0] == 200

        wait_until(healthy, timeout=timeout, what=f"GET {base_url}/healthz from the container to answer 200",
                   describe=self.describe)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltImage]:
    for tool in ("buildah", "mmdebstrap", "skopeo"):
        require_binary(tool)
    work = tmp_path_factory.mktemp("image")
    chosen = os.environ.get("GPUMOND_TEST_BUILDAH_STORAGE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpumond" / "test-buildah")
    kept = chosen != "tmp"
    storage = Path(chosen) if kept else work / "storage"
    storage.mkdir(parents=True, exist_ok=True)
    with _only_session_on(storage):
        yield from _built(work, storage, kept)


@contextlib.contextmanager
def _only_session_on(storage: Path) -> Iterator[None]:
    """Hold the storage for this session: a kept one is shared by every session of this user, and one session's
    cleanup (its containers, the images it untagged) must not pull the floor from under another's build."""
    with open(storage / ".session.lock", "w") as lock:
        deadline = time.monotonic() + BUILD_TIMEOUT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"another test session held {storage} for over {BUILD_TIMEOUT_S} s")
                time.sleep(1.0)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _built(work: Path, storage: Path, kept: bool) -> Iterator[BuiltImage]:
    conf = work / "storage.conf"
    conf.write_text(f'[storage]\ndriver = "{os.environ.get("STORAGE_DRIVER", "overlay")}"\n'
                    f'graphroot = "{storage / "root"}"\nrunroot = "{storage / "run"}"\n')
    env = {**os.environ, "CONTAINERS_STORAGE_CONF": str(conf), "BUILDAH_ISOLATION": "chroot"}
    env.pop("STORAGE_DRIVER", None)
    archive = work / "gpumond.oci.tar"
    revision = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    t0 = time.monotonic()
    try:
        p = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "build-image.sh"), "--local-base",
                            "--context", str(work / "context"), "--oci-archive", str(archive)],
                           cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"scripts/build-image.sh took over {BUILD_TIMEOUT_S} s:\n{(e.stderr or b'')[-3000:]!r}")
    assert p.returncode == 0, f"scripts/build-image.sh exited {p.returncode}:\n{p.stderr[-5000:]}"
    tag = p.stdout.strip().splitlines()[-1]
    print("\n" + "\n".join(line for line in p.stderr.splitlines() if line.startswith("build-image:")))
    yield BuiltImage(tag=tag, env=env, archive=archive, build_s=time.monotonic() - t0, revision=revision)
    subprocess.run(["buildah", "rm", "--all"], env=env, capture_output=True, timeout=120)
    archive.unlink(missing_ok=True)
    if kept:  # the base stays; earlier builds' images (untagged by this one) do not pile up
        subprocess.run(["buildah", "rmi", "--prune"], env=env, capture_output=True, timeout=120)
    else:  # ~700 MB (base, layers, image): not left for pytest's tmp retention
        shutil.rmtree(storage, ignore_errors=True)


@pytest.fixture(scope="module")
def container(image: BuiltImage) -> Iterator[str]:
    name = image.buildah("from", "--pull-never", "--quiet", image.tag).strip()
    yield name
    image.buildah("rm", name)


def _process_on_port(port: int) -> psutil.Process:
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return psutil.Process(conn.pid)
    raise AssertionError(f"nothing listens on port {port}")


def test_the_image_is_named_as_the_chart_expects_and_labelled(image: BuiltImage) -> None:
    chart = yaml.safe_load((REPO_ROOT / "deploy/helm/gpumond/Chart.yaml").read_text())
    values = yaml.safe_load((REPO_ROOT / "deploy/helm/gpumond/values.yaml").read_text())
    assert image.tag == f"{values['image']['repository']}:{chart['appVersion']}" == f"ghcr.io/gpumond/gpumond:{__version__}"

    config = json.loads(image.buildah("inspect", "--type", "image", image.tag))["OCIv1"]["config"]
    assert config["Entrypoint"] == ["gpumond"]
    assert config["User"] == f"{NOBODY}:{NOBODY}"
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.revision"] == image.revision
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.source"].startswith("https://")


def test_gpumond_version_in_the_image_is_the_package_version_and_no_driver_is_shipped(
        image: BuiltImage, container: str) -> None:
    assert image.buildah("run", container, "--", "gpumond", "--version").strip() == f"gpumond {__version__}"
    # NVML comes from the host driver (the NVIDIA container toolkit injects it), never from the image.
    found = image.buildah("run", container, "--", "python3", "-c",
                          "import ctypes.util; print(ctypes.util.find_library('nvidia-ml'))").strip()
    assert found == "None"


def test_the_agent_and_the_rules_service_run_from_the_image_as_nobody(
        image: BuiltImage, container: str, tmp_path: Path) -> None:
    agent_port, rules_port = free_port(), free_port()
    agent = ContainerProcess(image, container, ["gpumond", "agent", "--sim", "8", "--node-name", "image-node",
                                                "--listen", f"{LOOPBACK}:{agent_port}"],
                             tmp_path / "agent", label="image-agent")
    config = tmp_path / "etc"
    config.mkdir()
    # The rules service scrapes the agent in the other container; its state under /tmp, writable by nobody.
    (config / "rules.yaml").write_text(yaml.safe_dump({
        "listen": f"{LOOPBACK}:{rules_port}", "state_dir": "/tmp/gpumond-rules",
        "telemetry": {"scrape": {"targets": [f"{LOOPBACK}:{agent_port}"], "interval_s": 1.0, "timeout_s": 1.0}},
    }))
    config.chmod(0o755)
    (config / "rules.yaml").chmod(0o644)
    rules = ContainerProcess(image, container, ["gpumond", "rules", "--config", "/etc/gpumond/rules.yaml"],
                             tmp_path / "rules", label="image-rules", volumes=[f"{config}:/etc/gpumond:ro"],
                             env={"GPUMOND_RULES_TOKENS": "image-test-token-0123456789"})
    with agent, rules:
        agent.spawn()
        agent.wait_healthy(f"http://{LOOPBACK}:{agent_port}")
        rules.spawn()
        rules.wait_healthy(f"http://{LOOPBACK}:{rules_port}")

        families = parse_metrics(http_get(f"http://{LOOPBACK}:{agent_port}/metrics")[2].decode())
        up = {s.labels["gpu"]: s.value for s in families["gpumond_gpu_up"].samples}
        assert up == {str(i): 1.0 for i in range(8)}, up
        assert [s.labels["version"] for s in families["gpumond_build_info"].samples] == [__version__]

        def rules_read_the_agent() -> bool:
            fams = parse_metrics(http_get(f"http://{LOOPBACK}:{rules_port}/metrics")[2].decode())
            return [s.value for s in fams["gpumond_rules_telemetry_up"].samples] == [1.0]

        wait_until(rules_read_the_agent, timeout=30, what="the rules service in the image to scrape the agent",
                   describe=lambda: agent.describe() + "\n" + rules.describe())
        for port in (agent_port, rules_port):
            assert _process_on_port(port).uids().effective == NOBODY


def test_the_oci_archive_loads_with_skopeo(image: BuiltImage, tmp_path: Path) -> None:
    inspected = json.loads(subprocess.run(["skopeo", "inspect", f"oci-archive:{image.archive}"], capture_output=True,
                                          text=True, timeout=60, check=True).stdout)
    assert inspected["Labels"]["org.opencontainers.image.version"] == __version__
    # A copy reads every blob and checks its digest: what `skopeo copy` to a registry or a node would do.
    p = subprocess.run(["skopeo", "copy", "--quiet", f"oci-archive:{image.archive}", f"dir:{tmp_path / 'copy'}"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    size = sum(f.stat().st_size for f in (tmp_path / "copy").iterdir())
    print(f"image {image.tag}: built in {image.build_s:.0f} s, {size / 2**20:.0f} MiB compressed")
