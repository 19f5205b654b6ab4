"""The policy when its records fail: a full disk at SIGTERM or while acting, and a corrupt state file.

The disk is real where it can be: the audit log's descriptor is pointed at /dev/full (ENOSPC for root too), and
the state file's writer (constructor-injected) raises the same ENOSPC while the "disk" is full.
"""

from __future__ import annotations

import errno
import json
import logging
import os

import pynvml
import pytest

from gpumond.state.atomic import replace_atomically
from tests.contract.policy_rig import HOT, Rig, make

ENFORCE = {"mode": "enforce"}  # explicit: these tests are about actuation, whatever the default mode
EIGHTY = {**ENFORCE, "power_limit": {"default_w": "80%"}, "thermal": {"enabled": False}}


class Disk:
    """state_dir's file system: works until `fill()`, then every write fails with ENOSPC until `free()`."""

    def __init__(self) -> None:
        self.full = False
        self.fds: list[int] = []
        self._saved: list[tuple[int, int]] = []

    def write(self, path, text):
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        replace_atomically(path, text)

    def open(self, path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.fds.append(fd)
        return fd

    def fill(self):
        self.full = True
        dev_full = os.open("/dev/full", os.O_WRONLY)
        for fd in self.fds:
            self._saved.append((fd, os.dup(fd)))
            os.dup2(dev_full, fd)
        os.close(dev_full)

    def free(self):
        self.full = False
        for fd, kept in self._saved:
            os.dup2(kept, fd)
            os.close(kept)
        self._saved.clear()


def disk_rig(rigs, tmp_path, **kw):
    disk = Disk()
    return disk, make(rigs, tmp_path, state_write=disk.write, audit_opener=disk.open, **kw)


def alert_names(r):
    return {dict(s.labels)["alertname"] for s in r.series if s.name == "gpumond_alert_active"}


# ----- defect 1: SIGTERM on a full disk --------------------------------------------------------------------
def test_sigterm_on_a_full_disk_restores_every_gpu_and_says_what_was_not_recorded(tmp_path, rigs, caplog):
    disk, r = disk_rig(rigs, tmp_path, policy=EIGHTY)
    r.run(2)
    assert [g.power_limit_w for g in r.sim.gpus] == [560, 560]
    disk.fill()
    caplog.set_level(logging.INFO, logger="gpumond.policy")
    r.engine.stop()  # must not raise, must not stop at the first GPU
    assert [g.power_limit_w for g in r.sim.gpus] == [700, 700]
    restored = [x for x in caplog.records if x.getMessage() == "power limit restored"]
    assert sorted(x.gpu for x in restored) == [0, 1] and all(x.to_w == 700 for x in restored)
    last = caplog.records[-1]
    assert last.levelno == logging.ERROR and "not recorded" in last.getMessage()
    assert "No space left on device" in last.errors
    # the audit entries it could not write are in the log instead
    assert sum(1 for x in caplog.records if x.getMessage().startswith("audit entry not written")) == 2


# ----- defect 2: no set without a record first --------------------------------------------------------------
def test_a_full_disk_stops_actuation_and_pages_until_it_is_freed(tmp_path, rigs):
    disk, r = disk_rig(rigs, tmp_path, scenario=HOT, policy=ENFORCE)
    r.run(5)
    disk.fill()
    r.run(600)  # GPU 0 overheats: the controller wants to cap it, but cannot record that first
    assert r.sim.gpus[0].power_limit_w == 700
    assert r.value("gpumond_policy_actions_total", action="not_recorded") >= 1
    assert r.value("gpumond_policy_actions_total", action="set_limit") is None
    assert "GpumondPolicyNotRecorded" in alert_names(r)
    assert r.value("gpumond_policy_record_failing", file="state") == 1.0
    state = json.loads((tmp_path / "state.json").read_text())["gpus"][r.sim.gpus[0].uuid]
    assert state["last_set_w"] is None
    disk.free()
    r.run(60)
    assert r.sim.gpus[0].power_limit_w < 700
    state = json.loads((tmp_path / "state.json").read_text())["gpus"][r.sim.gpus[0].uuid]
    assert state["last_set_w"] == r.sim.gpus[0].power_limit_w  # the record matches the hardware
    assert "GpumondPolicyNotRecorded" not in alert_names(r)
    assert r.value("gpumond_policy_record_failing", file="state") == 0.0
    assert any(e["action"] == "set_limit" for e in r.audit())


def test_a_cap_set_before_the_disk_filled_stays_restorable(tmp_path, rigs):
    disk, r = disk_rig(rigs, tmp_path, scenario=HOT, policy=ENFORCE)
    r.run(600)
    capped = r.sim.gpus[0].power_limit_w
    assert capped < 700
    disk.fill()
    r.sim.inject({"kind": "cooling", "gpu": 0, "factor": 1.9})  # hotter still: it wants a lower cap
    r.run(300)
    assert r.sim.gpus[0].power_limit_w == capped  # withheld: no unrecorded change
    r.engine.stop()
    assert r.sim.gpus[0].power_limit_w == 700


def test_the_record_is_written_before_the_set(tmp_path, rigs):
    order = []

    def write(path, text):
        order.append(("record", json.loads(text)["gpus"]))
        replace_atomically(path, text)

    r = make(rigs, tmp_path, policy={**ENFORCE, "power_limit": {"per_gpu": {"0": 500}}, "thermal": {"enabled": False}},
             state_write=write)
    real_set = r.session.set_power_limit

    def set_power_limit(index, watts):
        order.append(("set", index, watts))
        return real_set(index, watts)

    r.engine._act = type("A", (), {"set_power_limit": staticmethod(set_power_limit)})()
    r.run(1)
    first_set = next(i for i, x in enumerate(order) if x[0] == "set")
    record_before = order[first_set - 1]
    assert record_before[0] == "record" and record_before[1][r.sim.gpus[0].uuid]["last_set_w"] == 500


# ----- defect 3: corrupt state ------------------------------------------------------------------------------
CORRUPT = {
    "truncated": b'{"version": 1, "gpus": {"GPU-',
    "empty": b"",
    "nuls": b"\x00" * 512,
    "wrong shape": b'{"version": 1, "gpus": []}',
    "version 2": b'{"version": 2, "gpus": {}}',
    "random bytes": bytes(range(256)) * 3,
}


def _capped_by_a_dead_run(rigs, tmp_path, body, **kw):
    """A node whose GPU 0 a dead run left at 500 W, with `body` as its state file (a function of the UUIDs)."""
    first = make(rigs, tmp_path / "probe", gpus=2)
    uuids = [g.uuid for g in first.sim.gpus]
    first.close()
    rigs.remove(first)
    (tmp_path / "state.json").write_bytes(body(uuids) if callable(body) else body)
    r = make(rigs, tmp_path, **kw)
    pynvml.nvmlDeviceSetPowerManagementLimit(pynvml.nvmlDeviceGetHandleByIndex(0), 500_000)
    assert [g.uuid for g in r.sim.gpus] == uuids
    return r


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_corrupt_state_falls_back_to_the_nvml_default_never_the_current_cap(tmp_path, rigs, name, caplog):
    r = _capped_by_a_dead_run(rigs, tmp_path, CORRUPT[name], policy={**ENFORCE, "thermal": {"enabled": False}})
    r.run(2)
    state = json.loads((tmp_path / "state.json").read_text())["gpus"]
    assert {u: s["original_w"] for u, s in state.items()} == {g.uuid: 700 for g in r.sim.gpus}
    assert (tmp_path / "state.json.corrupt.1").read_bytes() == CORRUPT[name]
    assert any("original limit taken from what is known for sure" in x.getMessage() for x in caplog.records)
    r.engine.stop()
    assert [g.power_limit_w for g in r.sim.gpus] == [700, 700]


@pytest.mark.parametrize("value", ["NaN", "-5", "1e9", "50"])
def test_an_impossible_original_is_replaced_and_sigterm_still_restores(tmp_path, rigs, value, caplog):
    def body(uuids):
        return (f'{{"version": 1, "gpus": {{"{uuids[0]}": {{"original_w": {value}, "last_set_w": 500}}}}}}'
                .encode())

    r = _capped_by_a_dead_run(rigs, tmp_path, body, policy={**ENFORCE, "thermal": {"enabled": False}})
    r.run(3)
    r.engine.stop()
    assert r.sim.gpus[0].power_limit_w == 700
    assert r.value("gpumond_policy_actions_total", action="restore_failed") is None


def test_in_dry_run_a_corrupt_state_still_uncaps_to_the_default(tmp_path, rigs):
    r = _capped_by_a_dead_run(rigs, tmp_path, b"\x00", policy={"mode": "dry_run"})
    r.run(2)
    assert r.sim.gpus[0].power_limit_w == 700


# ----- a fuzzer over the state file ---------------------------------------------------------------------------
_PROBE_UUIDS: list[str] = []


def _uuids() -> list[str]:
    if not _PROBE_UUIDS:
        from gpumond.nvml.sim import ManualClock, SimulatedNvml
        _PROBE_UUIDS.extend(g.uuid for g in SimulatedNvml(gpu_count=2, node="policy-node", clock=ManualClock()).gpus)
    return _PROBE_UUIDS


def _state_files():
    from hypothesis import strategies as st

    json_scalar = st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats() | st.text(max_size=8)
    json_any = st.recursive(json_scalar, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c,
                                                                                               max_size=3), max_leaves=8)
    watts = st.floats() | st.integers(-1000, 2000) | st.sampled_from([0, 200, 500, 699.5, 700, 700.5]) | json_any
    record = st.fixed_dictionaries({"original_w": watts}, optional={"last_set_w": st.none() | watts,
                                                                    "restore_pending": st.booleans() | json_any})
    uuid = st.sampled_from(_uuids()) | st.text(max_size=10)
    structured = st.fixed_dictionaries({"version": st.just(1) | json_any,
                                        "gpus": st.dictionaries(uuid, record | json_any, max_size=3) | json_any})
    as_json = (structured | json_any).map(lambda d: json.dumps(d).encode())
    cut = st.tuples(as_json, st.integers(0, 200)).map(lambda t: t[0][: t[1]])
    return st.binary(max_size=300) | as_json | cut


def _number(w: object, lo: float, hi: float) -> bool:
    return isinstance(w, int | float) and not isinstance(w, bool) and lo - 1 <= w <= hi + 1


def _may_trust(body: bytes, uuid: str, lo: float, hi: float) -> bool:
    """Whether the file could honestly say GPU `uuid`'s original: a version-1 file that has a number in range
    for it, or that is wholly the agent's own shape and has never heard of that GPU (gpumond never touched it)."""
    try:
        data = json.loads(body.decode("utf-8"))
        gpus = data["gpus"]
        if data.get("version") != 1 or not isinstance(gpus, dict):
            return False
        if uuid in gpus:
            return _number(gpus[uuid]["original_w"], lo, hi)
        return all(isinstance(r, dict) and _number(r.get("original_w"), 0, 1e300) for r in gpus.values())
    except Exception:
        return False


def test_fuzzed_state_files_never_crash_and_never_lose_the_default(tmp_path_factory):
    from hypothesis import HealthCheck, given, settings


    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
    @given(body=_state_files())
    def one(body: bytes) -> None:
        tmp = tmp_path_factory.mktemp("fuzz")
        (tmp / "state.json").write_bytes(body)
        r = Rig(tmp, policy={**ENFORCE, "thermal": {"enabled": False}})
        try:
            pynvml.nvmlDeviceSetPowerManagementLimit(pynvml.nvmlDeviceGetHandleByIndex(0), 500_000)  # a dead run's cap
            r.run(2)
            r.engine.stop()
            lo, hi = 200.0, 700.0  # the simulated H100's NVML constraints
            limits = [g.power_limit_w for g in r.sim.gpus]
            assert all(lo <= w <= hi for w in limits)
            uuid0 = r.sim.gpus[0].uuid
            if not _may_trust(body, uuid0, lo, hi):
                # nothing trustworthy about GPU 0 in the file: its original is NVML's default, never the 500 W cap
                state = json.loads((tmp / "state.json").read_text())["gpus"][uuid0]
                assert state["original_w"] == 700 and limits[0] == 700, (body, state, limits)
        finally:
            r.close()

    one()


def test_a_record_with_an_impossible_original_does_not_leave_a_dead_runs_cap(tmp_path):
    # Found by the fuzz above: the file names GPU 0 with original_w 1 W (outside its constraints) and no
    # last_set_w, while the GPU still holds a dead run's 500 W cap. The original is replaced by NVML's default,
    # and the cap must go with it: an untrusted record is not evidence that the operator set 500 W.
    r = Rig(tmp_path, policy={**ENFORCE, "thermal": {"enabled": False}})
    uuid0 = r.sim.gpus[0].uuid
    r.close()
    (tmp_path / "state.json").write_text(json.dumps({"version": 1, "gpus": {uuid0: {"original_w": 1.0}}}))
    r = Rig(tmp_path, policy={**ENFORCE, "thermal": {"enabled": False}})
    try:
        pynvml.nvmlDeviceSetPowerManagementLimit(pynvml.nvmlDeviceGetHandleByIndex(0), 500_000)
        r.run(2)
        r.engine.stop()
        assert r.sim.gpus[0].power_limit_w == 700
        assert json.loads((tmp_path / "state.json").read_text())["gpus"][uuid0]["original_w"] == 700
    finally:
        r.close()
