"""What the relay fills in: the GPU by the rank's pid (in any PID namespace, MIG first), the node, the job; the
rank's statement wins and a conflict is counted."""

from __future__ import annotations

import logging

import pytest

from gpumond.agent.relay.fill import FillError, Filler
from gpumond.agent.relay.processes import REFRESH_S, ProcessDevices, nspids
from gpumond.wire.procstat import start_ticks
from tests.fakes import FakeClock

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-11111111-1111-1111-1111-111111111111"
MIG = "MIG-22222222-2222-2222-2222-222222222222"


def devices(table: dict[str, tuple[int, ...]], namespaced: dict[int, tuple[int, ...]] | None = None,
            clock: FakeClock | None = None, started: dict[int, int] | None = None) -> ProcessDevices:
    spaces = namespaced or {}
    starts = started or {}
    return ProcessDevices(lambda: table, clock or FakeClock(), lambda pid: spaces.get(pid, (pid,)), starts.get)


def test_a_container_pid_finds_its_host_process_gpu() -> None:
    # host PID 4242 is PID 7 in its container; host PID 5000 runs on the other GPU
    found = devices({GPU0: (4242,), GPU1: (5000,)}, {4242: (4242, 7), 5000: (5000, 9)})
    assert found.device_of(7) == (GPU0, 4242) and found.device_of(4242) == (GPU0, 4242)
    assert found.device_of(9) == (GPU1, 5000)


def test_a_pid_on_two_devices_fills_nothing() -> None:
    # PID 1 in two containers: no guess
    found = devices({GPU0: (100,), GPU1: (200,)}, {100: (100, 1), 200: (200, 1)})
    assert found.device_of(1) is None and found.device_of(100) == (GPU0, 100)


def test_a_mig_device_wins_over_its_parent_gpu() -> None:
    found = devices({GPU0: (300,), MIG: (300,)})
    assert found.device_of(300) == (MIG, 300)


def test_nvml_is_asked_again_on_a_miss_at_most_every_refresh() -> None:
    calls = []
    table: dict[str, tuple[int, ...]] = {}
    clock = FakeClock()
    found = ProcessDevices(lambda: calls.append(1) or table, clock, lambda pid: (pid,))
    assert found.device_of(5) is None and found.device_of(5) is None and len(calls) == 1
    table[GPU0] = (5,)  # the rank's process now uses its GPU
    clock.advance(REFRESH_S)
    assert found.device_of(5) == (GPU0, 5) and len(calls) == 2


def test_nspid_is_read_from_proc_status(tmp_path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "status").write_text("Name:\tpython\nNSpid:\t42\t7\n")
    assert nspids(42, tmp_path) == (42, 7)
    assert nspids(43, tmp_path) == (43,)  # gone: only the host PID


def test_the_agent_fills_in_what_the_rank_leaves_out() -> None:
    filler = Filler("node-a", devices({GPU0: (4242,)}, {4242: (4242, 7)}), jobs_of=lambda pids: ("job-9",))
    who = filler.fill(job=None, node=None, gpu_uuid=None, pid=7)
    assert (who.job, who.node, who.gpu_uuid) == ("job-9", "node-a", GPU0)


def test_what_the_rank_states_wins_and_a_conflict_is_counted_and_logged_once(caplog) -> None:
    filler = Filler("node-a", devices({GPU0: (10,)}), jobs_of=lambda pids: ("job-9",))
    caplog.set_level(logging.WARNING, logger="gpumond.agent.relay")
    for _ in range(3):
        who = filler.fill(job="mine", node="node-b", gpu_uuid=GPU1, pid=10)
        assert (who.job, who.node, who.gpu_uuid) == ("mine", "node-b", GPU1)
    assert filler.conflicts == {"job": 3, "node": 3, "gpu_uuid": 3}
    assert len(caplog.records) == 3  # one line per field, whatever the count


def test_a_gpu_nobody_can_name_is_refused_with_what_to_set() -> None:
    filler = Filler("node-a", devices({}))
    with pytest.raises(FillError, match="no GPU of this node runs pid 5 .* set GPUMOND_GPU_UUID"):
        filler.fill(job="j", node=None, gpu_uuid=None, pid=5)
    with pytest.raises(FillError, match="GPUMOND_JOB_ID"):
        filler.fill(job=None, node=None, gpu_uuid=GPU0, pid=None)


def test_a_pid_another_container_uses_on_a_gpu_is_told_apart_by_its_start_time() -> None:
    """Pod A's pid 25 (host 100, started at tick 5000) runs on GPU0; pod B's pid 25 (started at 7000) is not yet on
    a GPU: B is not given A's GPU. An SDK that sends no start time is matched on its pid as before."""
    found = devices({GPU0: (100,)}, {100: (100, 25)}, started={100: 5000})
    assert found.device_of(25, 7000) is None
    assert found.device_of(25, 5000) == (GPU0, 100) and found.device_of(25) == (GPU0, 100)
    filler = Filler("node-a", found)
    with pytest.raises(FillError, match="no GPU of this node runs pid 25"):
        filler.fill(job="j", node=None, gpu_uuid=None, pid=25, pid_start=7000)


def test_pid_1_in_every_container_is_placed_by_its_start_time() -> None:
    found = devices({GPU0: (100,), GPU1: (200,)}, {100: (100, 1), 200: (200, 1)}, started={100: 5000, 200: 6000})
    assert found.device_of(1, 5000) == (GPU0, 100) and found.device_of(1, 6000) == (GPU1, 200)
    assert found.device_of(1) is None  # the pid alone stays ambiguous
    assert devices({GPU0: (100,)}, {100: (100, 1)}).device_of(1, 5000) is None  # a start time not known: no guess


def test_the_start_time_is_field_22_of_proc_stat_whatever_the_process_name(tmp_path) -> None:
    (tmp_path / "42").mkdir()
    fields = ["S"] + [str(n) for n in range(4, 22)] + ["987654321", "0", "0"]  # fields 3.. : 22 is 987654321
    (tmp_path / "42" / "stat").write_text("42 (py thon) (x)) " + " ".join(fields) + "\n")
    assert start_ticks(42, tmp_path) == 987654321
    assert start_ticks(43, tmp_path) is None
    (tmp_path / "44").mkdir()
    (tmp_path / "44" / "stat").write_text("44 (short) S 1 2\n")
    assert start_ticks(44, tmp_path) is None
