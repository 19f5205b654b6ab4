"""The shipped systemd units (agent, its drop-ins, rules service) verify cleanly and stay as hardened as measured."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed"),
]

SYSTEMD_DIR = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
AGENT = SYSTEMD_DIR / "gpumond-agent.service"
RULES = SYSTEMD_DIR / "gpumond-rules.service"
DROP_INS = SYSTEMD_DIR / "gpumond-agent.service.d"

# Measured with systemd 252 (`systemd-analyze security --offline=true`, which truncates to one decimal):
# unit [+ drop-in] -> its exposure. The bounds leave no room for a new weakening to slip in unnoticed.
# CAP_SYS_PTRACE costs 0.3 and ProtectProc=ptraceable wins 0.2 back: the job-attribution mode stays at 2.1.
EXPOSURE = {
    ("gpumond-agent.service", None): 2.0,
    ("gpumond-agent.service", "job-attribution.conf"): 2.1,
    ("gpumond-agent.service", "read-only.conf"): 1.7,
    ("gpumond-rules.service", None): 1.1,
}
CASES = list(EXPOSURE)
CASE_IDS = [unit.split(".")[0].removeprefix("gpumond-") + (f"+{d.removesuffix('.conf')}" if d else "")
            for unit, d in CASES]


def _staged(tmp_path: Path, unit: str = AGENT.name, drop_in: str | None = None) -> Path:
    """A copy of the unit whose ExecStart binary exists, so verify judges only the unit."""
    text = (SYSTEMD_DIR / unit).read_text()
    assert text.count("ExecStart=/usr/local/bin/gpumond ") == 1
    staged = tmp_path / unit
    staged.write_text(text.replace("ExecStart=/usr/local/bin/gpumond ", "ExecStart=/bin/true "))
    if drop_in:
        target = tmp_path / f"{unit}.d"
        target.mkdir()
        shutil.copy(DROP_INS / drop_in, target / drop_in)
    return staged


def _run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def _exposure(unit: Path) -> float:
    result = _run("systemd-analyze", "security", "--offline=true", "--no-pager", unit, cwd=unit.parent)
    assert result.returncode == 0, result.stderr
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", result.stdout)
    assert match, result.stdout[-2000:]
    return float(match.group(1))


def _settings(unit: Path) -> list[tuple[str, str]]:
    return [tuple(line.split("=", 1)) for line in unit.read_text().splitlines()  # type: ignore[misc]
            if "=" in line and not line.lstrip().startswith("#")]


def test_every_drop_in_is_measured() -> None:
    assert sorted(p.name for p in DROP_INS.glob("*.conf")) == sorted(d for _, d in CASES if d)


@pytest.mark.parametrize(("unit", "drop_in"), CASES, ids=CASE_IDS)
def test_verify_is_silent(tmp_path: Path, unit: str, drop_in: str | None) -> None:
    staged = _staged(tmp_path, unit, drop_in)
    # --recursive-errors=no: judge this unit, not whatever else is installed on the host.
    result = _run("systemd-analyze", "verify", "--man=no", "--recursive-errors=no", staged, cwd=tmp_path)
    assert result.returncode == 0
    assert (result.stdout + result.stderr).strip() == ""


@pytest.mark.parametrize(("unit", "drop_in"), CASES, ids=CASE_IDS)
def test_exposure_score_bound(tmp_path: Path, unit: str, drop_in: str | None) -> None:
    assert _exposure(_staged(tmp_path, unit, drop_in)) <= EXPOSURE[(unit, drop_in)]


def test_nvml_essentials_kept() -> None:
    """Settings that would hide the GPUs or confine CAP_SYS_ADMIN must never creep in."""
    settings = _settings(AGENT)
    keys = {key for key, _ in settings}
    assert not keys & {"PrivateDevices", "PrivateUsers", "ProcSubset", "DynamicUser", "ProtectProc"}
    assert ("AmbientCapabilities", "CAP_SYS_ADMIN") in settings
    assert ("CapabilityBoundingSet", "CAP_SYS_ADMIN") in settings
    assert ("RestartPreventExitStatus", "2") in settings
    assert ("DevicePolicy", "closed") in settings


def test_read_only_drop_in_leaves_no_capability(tmp_path: Path) -> None:
    result = _run("systemd-analyze", "security", "--offline=true", "--no-pager",
                  _staged(tmp_path, AGENT.name, "read-only.conf"), cwd=tmp_path)
    assert "✗ CapabilityBoundingSet=~CAP_SYS_ADMIN" not in result.stdout
    assert "✗ AmbientCapabilities=" not in result.stdout


def test_units_match_the_configs_defaults() -> None:
    """ExecStart, user and StateDirectory agree with what each daemon reads by default."""
    from gpumond.config.agent import AgentConfig
    from gpumond.config.rules import RulesConfig

    for unit, command, state_dir, user in (
            (AGENT, "agent", AgentConfig.model_fields["state_dir"].default, "gpumond"),
            (RULES, "rules", RulesConfig.model_fields["state_dir"].default, "gpumond-rules")):
        settings = dict(_settings(unit))
        assert settings["ExecStart"] == f"/usr/local/bin/gpumond {command} --config /etc/gpumond/{command}.yaml"
        assert Path("/var/lib") / settings["StateDirectory"] == state_dir
        assert settings["User"] == settings["Group"] == user


def test_rules_unit_holds_nothing() -> None:
    """The rules service needs no capability, no device and no other process: the unit grants none."""
    settings = _settings(RULES)
    for expected in (("CapabilityBoundingSet", ""), ("AmbientCapabilities", ""), ("PrivateDevices", "yes"),
                     ("PrivateUsers", "yes"), ("ProtectProc", "invisible"), ("ProcSubset", "pid"),
                     ("MemoryDenyWriteExecute", "yes"), ("RestartPreventExitStatus", "2")):
        assert expected in settings, expected


# Runs `gpumond rules` with the kernel's memory-deny-write-execute (PR_SET_MDWE, Linux >= 6.3), the
# protection MemoryDenyWriteExecute= asks for: first proves it is on (a W+X mapping is refused), then execs.
_MDWE_WRAPPER = """
import ctypes, mmap, os, sys
if ctypes.CDLL(None, use_errno=True).prctl(65, 1, 0, 0, 0) != 0:
    sys.exit(77)
try:
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    sys.exit(78)
except OSError:
    pass
os.execv(sys.executable, [sys.executable, "-m", "gpumond.cli", *sys.argv[1:]])
"""


def test_rules_service_runs_under_memory_deny_write_execute(tmp_path: Path) -> None:
    from tests.integration.helpers import LOOPBACK, REPO_ROOT, ManagedProcess, free_port, http_get, wait_until

    token = "0123456789abcdef0123456789abcdef"
    config = tmp_path / "rules.yaml"
    config.write_text(f"tokens: [{token}]\nstate_dir: {tmp_path / 'state'}\nevaluation_interval_s: 1\n")
    (tmp_path / "state").mkdir()
    port = free_port()
    proc = ManagedProcess([sys.executable, "-c", _MDWE_WRAPPER, "rules", "--config", str(config),
                           "--listen", f"{LOOPBACK}:{port}"], tmp_path / "run",
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"})
    with proc:
        proc.spawn()

        def ready() -> bool:
            if proc.proc is not None and proc.proc.poll() == 77:
                pytest.skip("this kernel has no PR_SET_MDWE (Linux < 6.3)")
            assert proc.proc is None or proc.proc.poll() != 78, "PR_SET_MDWE on, yet a W+X mapping was allowed"
            return http_get(f"http://{LOOPBACK}:{port}/readyz", timeout=1.0)[0] == 200

        wait_until(ready, timeout=30, what="rules /readyz 200 under PR_SET_MDWE", describe=proc.describe)
        body = json.dumps({"job": "mdwe", "rank": 0, "world_size": 1, "node": "n0",
                           "gpu_uuid": "GPU-5b0c1d2e-0000-4000-8000-000000000001",
                           "steps": [{"step": 1, "end": time.time(), "duration_s": 0.5, "data_wait_s": 0.01}]})
        req = urllib.request.Request(f"http://{LOOPBACK}:{port}/api/v1/push", data=body.encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 202


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="systemd-sysusers not installed")
@pytest.mark.parametrize("user", ["gpumond", "gpumond-rules"])
def test_sysusers_creates_locked_system_user(tmp_path: Path, user: str) -> None:
    (tmp_path / "etc").mkdir()
    conf = SYSTEMD_DIR / "gpumond.sysusers.conf"
    result = _run("systemd-sysusers", f"--root={tmp_path}", conf, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    entry = next(
        line.split(":") for line in (tmp_path / "etc/passwd").read_text().splitlines()
        if line.startswith(f"{user}:")
    )
    assert int(entry[2]) < 1000  # a system uid
    assert entry[6] in ("/usr/sbin/nologin", "/sbin/nologin")


def test_no_unit_offers_a_reload() -> None:
    # SIGHUP stops a daemon like SIGTERM (gpumond/web/serving.py): an ExecReload sending it would stop the service.
    for name in ("gpumond-agent.service", "gpumond-rules.service"):
        text = (Path(__file__).resolve().parents[2] / "deploy" / "systemd" / name).read_text()
        assert "ExecReload" not in "\n".join(x for x in text.splitlines() if not x.startswith("#")), name
