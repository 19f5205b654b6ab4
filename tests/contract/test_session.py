"""The NVML boundary through the real pynvml over the simulated NVML: every error class, per field and per GPU."""

import logging

import pynvml

from gpumond.nvml.session import LOST_RETRY_MAX_S, GpuIdentity, NvmlSession, TierRead


def values(read: TierRead, gpu: int) -> dict[tuple[str, str], float]:
    g = read.gpus[gpu]
    assert g.identity.index == gpu
    return {(r, k): v for r, k, v in g.triples()}


def test_every_catalogue_reader_is_read_on_a_hopper_gpu(make_session):
    sim, s, _ = make_session(gpus=2)
    fast, slow = s.read("fast"), s.read("slow")
    assert fast.nvml_up and all(g.up for g in fast.gpus)
    v = values(fast, 0) | values(slow, 0)
    for key in [("temperature", "gpu"), ("fields_fast", "memory_temp"), ("power", "watts"),
                ("power_limit", "enforced"), ("energy", "total"), ("sm_clock", "current"),
                ("utilization", "gpu"), ("memory", "used"), ("clocks_event", "mask"),
                ("limit_constraints", "max"), ("limit_default", "default"), ("thresholds", "slowdown"),
                ("ecc", "uncorrected_volatile"), ("remapped_rows", "pending"), ("pcie_replay", "count")]:
        assert key in v, key
    assert v[("limit_constraints", "min")] == 200_000 and v[("limit_constraints", "max")] == 700_000
    assert abs(v[("temperature", "gpu")] - sim.gpus[0].temperature_c) <= 1
    ids = s.identities
    assert len({i.uuid for i in ids}) == 2 and ids[0].pci_bus_id.startswith("00000000:")


def test_not_supported_fields_are_skipped_on_an_older_gpu_and_probed_once(make_session):
    from gpumond.nvml.sim import Scenario

    sim, s, clock = make_session(gpus=2, scenario=Scenario.model_validate({"gpus": [{"index": 1, "model": "v100-sxm2"}]}))
    s.read("fast"), s.read("slow")
    probe_calls = sim.gpus[1].device_calls
    clock.advance(1)
    fast, slow = s.read("fast"), s.read("slow")
    steady_calls = sim.gpus[1].device_calls - probe_calls
    v = values(fast, 1) | values(slow, 1)
    assert ("fields_fast", "memory_temp") not in v  # no HBM sensor: absent, not 0
    assert ("remapped_rows", "pending") not in v
    assert ("retired_pages", "double_bit") in v  # pre-Ampere path instead
    assert v[("power", "watts")] > 0  # POWER_AVERAGE field unsupported → nvmlDeviceGetPowerUsage
    assert v[("temperature", "gpu")] > 0  # GetTemperatureV unsupported → GetTemperature
    # after the probe, unsupported calls and failed alternatives are never made again
    assert steady_calls < probe_calls
    before = sim.gpus[1].device_calls
    clock.advance(1)
    s.read("fast"), s.read("slow")
    assert sim.gpus[1].device_calls - before == steady_calls


def test_function_not_found_falls_back_to_the_older_symbol_and_says_so_once(make_session, caplog):
    caplog.set_level(logging.INFO, logger="gpumond.nvml")
    _, s, clock = make_session(gpus=2, missing_functions=frozenset({"nvmlDeviceGetTemperatureV"}))
    for _ in range(3):
        read = s.read("fast")
        clock.advance(1)
    assert all(("temperature", "gpu") in values(read, i) for i in range(2))
    said = [r for r in caplog.records if r.getMessage() == "nvml call not available"
            and getattr(r, "call", "") == "nvmlDeviceGetTemperatureV"]
    assert len(said) == 1 and said[0].error == "function_not_found"


def test_single_field_not_supported_or_no_permission_leaves_only_that_value_out(make_session):
    sim, s, clock = make_session(gpus=2)
    sim.inject({"kind": "nvml_error", "gpu": 0, "function": "nvmlDeviceGetPcieReplayCounter",
                "error": "no_permission"})
    sim.inject({"kind": "nvml_error", "gpu": 0, "function": "nvmlDeviceGetTotalEnergyConsumption",
                "error": "not_supported"})
    fast, slow = s.read("fast"), s.read("slow")
    v0, v1 = values(fast, 0) | values(slow, 0), values(fast, 1) | values(slow, 1)
    assert ("pcie_replay", "count") not in v0 and ("energy", "total") not in v0
    assert ("pcie_replay", "count") in v1 and ("energy", "total") in v1
    assert fast.gpus[0].up and ("temperature", "gpu") in v0


def test_unknown_is_retried_and_counted(make_session):
    sim, s, clock = make_session(gpus=2)
    sim.inject({"kind": "nvml_error", "gpu": 1, "function": "nvmlDeviceGetPowerUsage", "error": "unknown",
                "count": 1})
    sim.inject({"kind": "nvml_error", "gpu": 1, "function": "nvmlDeviceGetUtilizationRates",
                "error": "unknown", "count": 3})
    sim.inject({"kind": "nvml_error", "gpu": 1, "function": "nvmlDeviceGetFieldValues", "error": "unknown",
                "count": 1})
    read = s.read("fast")
    v = values(read, 1)
    assert ("fields_fast", "memory_temp") in v  # one Unknown, retried at once, value kept
    assert ("utilization", "gpu") not in v  # failed twice in this cycle: left out, not stale
    assert s.errors_total[(1, "nvmlDeviceGetUtilizationRates", "unknown")] == 2
    clock.advance(1)
    read = s.read("fast")
    assert ("utilization", "gpu") in values(read, 1)  # the third failure was retried in-cycle
    assert s.errors_total[(1, "nvmlDeviceGetUtilizationRates", "unknown")] == 3
    assert read.gpus[1].up


def test_gpu_lost_is_up_zero_within_one_cycle_its_handle_left_alone_then_recovered(make_session):
    sim, s, clock = make_session(gpus=4)
    s.read("fast")
    sim.inject({"kind": "lost", "gpu": 2, "duration_s": 30})
    read = s.read("fast")
    assert [g.up for g in read.gpus] == [True, True, False, True]
    assert values(read, 3)[("temperature", "gpu")] > 0  # peers unaffected
    touched = sim.gpus[2].device_calls
    for _ in range(5):  # 5 s: inside the first backoff windows (2 s, 4 s)
        clock.advance(1)
        read = s.read("fast")
        s.read("slow")
        assert not read.gpus[2].up
    # at most the backoff probes (one GetHandleByUUID + GetUUID each) touched it
    assert sim.gpus[2].device_calls - touched <= 2
    clock.advance(40)  # the fault ends at 30 s; next retry brings it back
    for _ in range(3):
        read = s.read("fast")
        clock.advance(10)
    assert read.gpus[2].up and ("temperature", "gpu") in values(read, 2)


def test_lost_gpu_inside_a_field_values_batch_is_still_lost(make_session):
    sim, s, _ = make_session(gpus=2)
    sim.inject({"kind": "nvml_error", "gpu": 0, "function": "nvmlDeviceGetTemperatureV", "error": "gpu_is_lost",
                "count": 1})
    read = s.read("fast")
    assert not read.gpus[0].up and read.gpus[1].up


def test_driver_mismatch_is_a_clear_log_line_and_up_zero_not_a_crash(make_session, caplog):
    caplog.set_level(logging.ERROR, logger="gpumond.nvml")
    _, s, clock = make_session(gpus=2, init_error="lib_rm_version_mismatch")
    assert not s.up
    read = s.read("fast")
    assert not read.nvml_up and read.gpus == ()
    assert "reboot" in read.error
    lines = [r for r in caplog.records if r.getMessage() == "nvml unavailable"]
    assert len(lines) == 1 and lines[0].error == "lib_rm_version_mismatch"
    for _ in range(10):  # retried with backoff, said once
        clock.advance(30)
        s.read("fast")
    assert len([r for r in caplog.records if r.getMessage() == "nvml unavailable"]) == 1


def test_compute_pids_and_handle_mapping(make_session):
    sim, s, _ = make_session(gpus=2)
    sim.set_processes(1, [4242, 4243])
    assert s.compute_pids() == {0: (), 1: (4242, 4243)}
    h = s.handles()[1]
    assert s.index_of_handle(h) == 1


def test_refused_compute_processes_back_off_on_their_own_and_leave_tier_reads_alone(make_session):
    sim, s, clock = make_session(gpus=2)
    sim.set_processes(0, [4242])
    sim.inject({"kind": "nvml_error", "gpu": 0, "function": "nvmlDeviceGetComputeRunningProcesses_v3",
                "error": "no_permission", "count": 2})
    assert s.compute_pids() == {1: ()}  # refused: GPU 0 left out, not reported as idle
    before = sim.gpus[0].device_calls
    clock.advance(5)
    assert s.compute_pids() == {1: ()} and sim.gpus[0].device_calls == before  # inside the back-off
    # the back-off is not a tier reader's: fast reads have nothing to re-probe on GPU 0
    s.read("fast")
    assert s._gpus[0].unsupported == {}
    clock.advance(5)
    assert s.compute_pids() == {1: ()}  # asked again at 10 s, refused again: next in 20 s
    clock.advance(19)
    assert s.compute_pids() == {1: ()}
    clock.advance(1)
    assert s.compute_pids() == {0: (4242,), 1: ()}


def test_a_brief_no_permission_on_a_reader_that_answered_does_not_hide_it(make_session, caplog):
    caplog.set_level(logging.INFO, logger="gpumond.nvml")
    sim, s, clock = make_session(gpus=2)
    assert ("utilization", "gpu") in values(s.read("fast"), 0)
    sim.inject({"kind": "nvml_error", "gpu": 0, "function": "nvmlDeviceGetUtilizationRates",
                "error": "no_permission", "count": 2})
    seen = []
    for _ in range(4):
        clock.advance(1)
        seen.append(("utilization", "gpu") in values(s.read("fast"), 0))
    # left out while refused (never stale, never 0), back on the first cycle it answers again
    assert seen == [False, False, True, True]


def test_isolated_refusals_between_good_reads_never_add_up_to_unsupported(make_session):
    sim, s, clock = make_session(gpus=1)
    assert ("utilization", "gpu") in values(s.read("fast"), 0)
    seen = []
    for _ in range(4):  # one refusal, then good reads, four times: "in a row" is never reached
        sim.inject({"kind": "nvml_error", "gpu": 0, "function": "nvmlDeviceGetUtilizationRates",
                    "error": "no_permission", "count": 1})
        for _ in range(3):
            clock.advance(1)
            seen.append(("utilization", "gpu") in values(s.read("fast"), 0))
    assert seen == [False, True, True] * 4


def test_not_supported_learnt_from_a_transient_answer_is_probed_again_with_backoff(make_session, caplog):
    caplog.set_level(logging.INFO, logger="gpumond.nvml")
    sim, s, clock = make_session(gpus=2)
    # refused from the very first call: the session cannot tell this from a GPU that lacks the function
    sim.inject({"kind": "nvml_error", "gpu": 1, "function": "nvmlDeviceGetUtilizationRates",
                "error": "not_supported", "count": 2})
    back_at = None
    for second in range(40):
        if ("utilization", "gpu") in values(s.read("fast"), 1):
            back_at = second
            break
        clock.advance(1)
    # probe at 0 s refused (unsupported), re-probe at 10 s refused (next in 20 s), re-probe at 30 s answers
    assert back_at == 30
    assert any(r.getMessage() == "nvml call available again" and r.reader == "utilization" for r in caplog.records)


def test_a_reader_a_gpu_really_lacks_is_reprobed_rarely_with_a_capped_backoff(make_session):
    from gpumond.nvml.sim import Scenario

    sim, s, clock = make_session(gpus=1, scenario=Scenario.model_validate({"gpus": [{"index": 0,
                                                                                        "model": "v100-sxm2"}]}))
    probes = []
    for second in range(0, 600, 5):  # 10 minutes of slow-tier reads every 5 s
        before = sim.gpus[0].device_calls
        read = s.read("slow")
        assert ("remapped_rows", "pending") not in values(read, 0)
        if second:
            probes.append((second, sim.gpus[0].device_calls - before))
        clock.advance(5)
    # steady reads cost the same; the extra call shows at the re-probe times 10, 30, 70, 130, 190, 250… s
    # (back-off 10, 20, 40, 60 = retry_max_s here, then every 60 s): 11 probes in 10 minutes, not 120
    steady = min(n for _, n in probes)
    extra = [t for t, n in probes if n > steady]
    assert extra[:5] == [10, 30, 70, 130, 190] and len(extra) <= 12


def test_a_gpu_lost_at_start_is_one_gpu_down_not_the_whole_node(make_session, caplog):
    from gpumond.nvml.sim import Scenario

    caplog.set_level(logging.ERROR, logger="gpumond.nvml")
    scenario = Scenario.model_validate({"faults": [{"gpu": 1, "kind": "lost", "at_s": 0, "duration_s": 20}]})
    sim, s, clock = make_session(gpus=3, scenario=scenario)
    assert s.up
    read = s.read("fast")
    assert read.nvml_up and [g.up for g in read.gpus] == [True, False, True]
    assert ("temperature", "gpu") in values(read, 0) and ("temperature", "gpu") in values(read, 2)
    assert s.identities[1].index == 1 and s.identities[1].uuid == ""  # never identified yet
    assert not [r for r in caplog.records if r.getMessage() == "nvml unavailable"]
    back_at = None
    for second in range(1, 40):
        clock.advance(1)
        if s.read("fast").gpus[1].up:
            back_at = second
            break
    assert back_at is not None and 20 <= back_at <= 20 + LOST_RETRY_MAX_S
    assert s.identities[1].uuid == sim.gpus[1].uuid  # identified once it answers


def test_sixteen_gpus_lost_at_once_give_one_log_line_naming_each(make_session):
    import io
    import sys
    import threading

    from gpumond.logs import setup_logging

    logger, root = logging.getLogger("gpumond"), logging.getLogger()
    saved = (logger.handlers[:], logger.level, root.handlers[:], root.level, threading.excepthook,
             sys.unraisablehook)
    stream = io.StringIO()
    try:
        setup_logging("info", "logfmt", stream)
        sim, s, _ = make_session(gpus=16)
        for i in range(16):
            sim.inject({"kind": "lost", "gpu": i})
        assert not any(g.up for g in s.read("fast").gpus)
    finally:
        logger.handlers[:], logger.level, root.handlers[:], root.level = saved[:4]
        threading.excepthook, sys.unraisablehook = saved[4:]
        logging.captureWarnings(False)
    lost = [line for line in stream.getvalue().splitlines() if 'msg="gpu lost"' in line]
    assert sorted(int(line.split(" gpu=")[1].split()[0]) for line in lost) == list(range(16))


def test_a_returning_gpu_is_noticed_within_the_lost_retry_bound(make_session):
    sim, s, clock = make_session(gpus=2)
    s.read("fast")
    sim.inject({"kind": "lost", "gpu": 0, "duration_s": 50})
    seconds_down = 0
    while not s.read("fast").gpus[0].up:
        assert seconds_down < 120
        clock.advance(1)
        seconds_down += 1
    # back at 50 s; noticed at the first 1 s cycle after the next probe (probes every <= 8 s): 50..58 s,
    # where a doubling back-off found it only at 62 s
    assert 50 <= seconds_down <= 50 + LOST_RETRY_MAX_S


def _lost_at_start(remembered):
    from gpumond.nvml.sim import ManualClock, Scenario, SimulatedNvml

    scenario = Scenario.model_validate({"faults": [{"gpu": 1, "kind": "lost", "at_s": 0, "duration_s": 20}]})
    clock = ManualClock()
    sim = SimulatedNvml(gpu_count=3, node="test-node", clock=clock, scenario=scenario)
    s = NvmlSession(install=sim.install, clock=clock.now, retry_max_s=60, remembered=remembered(sim))
    s.open()
    return sim, s, clock


def _until_back(s, clock, gpu):
    for _ in range(60):
        clock.advance(1)
        if s.read("fast").gpus[gpu].up:
            return
    raise AssertionError("never came back")


def test_a_gpu_lost_at_start_keeps_the_identity_it_had_last_run_until_it_answers():
    # Its alerts carry its UUID: nameless, the restarted agent's GpuLost would be a new alert (a second page).
    sim, s, clock = _lost_at_start(lambda sim: {1: GpuIdentity(1, sim.gpus[1].uuid, "NVIDIA H100", "0000:1b:00.0")})
    try:
        assert not s.read("fast").gpus[1].up
        assert s.identities[1].uuid == sim.gpus[1].uuid and s.identities[1].name == "NVIDIA H100"
        _until_back(s, clock, 1)
        assert s.identities[1] == GpuIdentity(1, sim.gpus[1].uuid, pynvml.nvmlDeviceGetName(s.handles()[1]),
                                              s.identities[1].pci_bus_id, s.identities[1].minor)
        assert s.identities[1].pci_bus_id != "0000:1b:00.0"  # read afresh, not the remembered one
    finally:
        s.close()
        sim.uninstall()


def test_a_different_gpu_at_a_remembered_index_is_read_as_itself():
    stranger = "GPU-00000000-0000-0000-0000-000000000001"  # what index 1 held last run: another board
    sim, s, clock = _lost_at_start(lambda sim: {1: GpuIdentity(1, stranger, "old board", "0000:99:00.0")})
    try:
        assert s.identities[1].uuid == stranger  # all that is known while it does not answer
        _until_back(s, clock, 1)  # found by index, not by the remembered UUID (which would never answer)
        assert s.identities[1].uuid == sim.gpus[1].uuid != stranger
    finally:
        s.close()
        sim.uninstall()
