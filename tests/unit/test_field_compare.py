"""The GPU field check's comparisons (benchmarks/_field_compare.py) on fixed nvidia-smi, /metrics and log text."""

from __future__ import annotations

import pytest

from benchmarks import _field_compare as fc

UUID = "GPU-11111111-2222-3333-4444-555555555555"
HELP = '''List of valid properties to query for the switch "--query-gpu=":

"index"
Zero based index of the GPU. Can change at each boot.

"timestamp"
The timestamp of when the query was made in format "YYYY/MM/DD HH:MM:SS.msec".

"clocks.current.sm" or "clocks.sm"
Current frequency of SM (Streaming Multiprocessor) clock.

    "power.draw"
    The last measured power draw for the entire board, in watts.
'''


def metrics(gpu_lines: str = "", node_lines: str = "") -> fc.Scrape:
    info = f'gpumond_gpu_info{{gpu="0",name="NVIDIA H200",pci_bus_id="00000000:1B:00.0",uuid="{UUID}"}} 1\n'
    return fc.parse_scrape(info + gpu_lines + node_lines)


def series(name: str, value: float, **labels: str) -> str:
    extra = "".join(f',{k}="{v}"' for k, v in labels.items())
    return f'{name}{{gpu="0",uuid="{UUID}"{extra}}} {value}\n'


def smi_row(**values: str | None) -> dict[int, dict[str, str | None]]:
    return {0: {"index": "0", **values}}


def test_help_parsing_keeps_known_fields_and_aliases_and_names_the_rest() -> None:
    have, lacking = fc.usable_fields(HELP, ["index", "clocks.sm", "power.draw", "power.draw.average"])
    assert have == ["index", "clocks.sm", "power.draw"]
    assert lacking == ["power.draw.average"]


def test_csv_rows_map_unsupported_values_to_none_and_refuse_a_short_line() -> None:
    rows = fc.parse_smi_csv("0, 71, [Not Supported], 0x0000000000000004\n1, [N/A], 12.5, 0x0\n",
                            ["index", "temperature.gpu", "power.draw", "clocks_event_reasons.active"])
    assert rows[0] == {"index": "0", "temperature.gpu": "71", "power.draw": None,
                       "clocks_event_reasons.active": "0x0000000000000004"}
    assert rows[1]["temperature.gpu"] is None
    assert fc.number(rows[0]["clocks_event_reasons.active"]) == 4.0
    with pytest.raises(ValueError, match="2 values for 3 fields"):
        fc.parse_smi_csv("0, 71\n", ["index", "a", "b"])


def test_a_reading_agrees_within_its_tolerance_and_fails_outside_it() -> None:
    temp = next(f for f in fc.FIELDS if f.smi == ("temperature.gpu",))
    pairs = [(smi_row(**{"temperature.gpu": t}), metrics(series("gpumond_gpu_temperature_celsius", a)))
             for t, a in (("70", 71), ("70", 72), ("71", 71))]
    [check] = fc.compare_readings(pairs, [temp])
    assert check.ok, check
    far = [(smi_row(**{"temperature.gpu": "60"}), metrics(series("gpumond_gpu_temperature_celsius", 71)))]
    [check] = fc.compare_readings(far, [temp])
    assert check.ok is False and "nvidia-smi 60 °C, agent 71 °C" in check.detail


def test_units_are_converted_before_comparing() -> None:
    sm = next(f for f in fc.FIELDS if f.smi == ("clocks.max.sm",))
    mem = next(f for f in fc.FIELDS if f.smi == ("memory.total",))
    pairs = [(smi_row(**{"clocks.max.sm": "1980", "memory.total": "143771"}),
              metrics(series("gpumond_gpu_sm_clock_max_hertz", 1.98e9)
                      + series("gpumond_gpu_memory_total_bytes", 143771 * 1024 * 1024)))]
    assert all(c.ok for c in fc.compare_readings(pairs, [sm, mem]))
    off = [(smi_row(**{"clocks.max.sm": "1980"}), metrics(series("gpumond_gpu_sm_clock_max_hertz", 1.755e9)))]
    assert fc.compare_readings(off, [sm])[0].ok is False


def test_a_value_only_one_side_has_fails_and_one_neither_has_passes() -> None:
    power = next(f for f in fc.FIELDS if f.series == "gpumond_gpu_power_watts")
    agent_lacks = [(smi_row(**{"power.draw.average": "120.5"}), metrics())]
    [check] = fc.compare_readings(agent_lacks, [power])
    assert check.ok is False and "the agent leaves it out" in check.detail
    driver_lacks = [(smi_row(**{"power.draw.average": None}), metrics(series("gpumond_gpu_power_watts", 120)))]
    assert fc.compare_readings(driver_lacks, [power])[0].ok is False
    neither = [(smi_row(**{"power.draw.average": None}), metrics())]
    assert fc.compare_readings(neither, [power])[0].ok is True


def test_the_preferred_nvidia_smi_name_is_used_when_the_driver_has_it_else_the_older_one() -> None:
    power = next(f for f in fc.FIELDS if f.series == "gpumond_gpu_power_watts")
    old_driver = [(smi_row(**{"power.draw": "300"}), metrics(series("gpumond_gpu_power_watts", 302)))]
    [check] = fc.compare_readings(old_driver, [power])
    assert check.ok and check.name == "GPU 0 power.draw"


def test_ecc_counters_are_matched_by_their_labels() -> None:
    ecc = [f for f in fc.FIELDS if f.series.startswith("gpumond_gpu_ecc_errors_total")]
    values = {f.smi[0]: "0" for f in ecc} | {"ecc.errors.corrected.volatile.total": "3"}
    scrape = metrics("".join(series("gpumond_gpu_ecc_errors_total", 3 if (s, k) == ("volatile", "corrected") else 0,
                                    scope=s, type=k)
                             for s in ("volatile", "aggregate") for k in ("corrected", "uncorrected")))
    assert all(c.ok for c in fc.compare_readings([(smi_row(**values), scrape)], ecc))
    values["ecc.errors.corrected.volatile.total"] = "4"
    assert [c.ok for c in fc.compare_readings([(smi_row(**values), scrape)], ecc)].count(False) == 1


def test_identity_is_exact_but_bus_ids_ignore_case() -> None:
    row = smi_row(uuid=UUID, name="NVIDIA H200", **{"pci.bus_id": "00000000:1b:00.0"})
    assert all(c.ok for c in fc.compare_identity(row, metrics()))
    row[0]["uuid"] = "GPU-other"
    assert [c.name for c in fc.compare_identity(row, metrics()) if not c.ok] == ["GPU 0 uuid"]


def test_ecc_series_must_be_present_exactly_when_ecc_is_enabled() -> None:
    with_ecc = metrics(series("gpumond_gpu_ecc_errors_total", 0, scope="volatile", type="corrected"))
    assert fc.compare_ecc_mode(smi_row(**{"ecc.mode.current": "Enabled"}), with_ecc)[0].ok
    assert fc.compare_ecc_mode(smi_row(**{"ecc.mode.current": "Disabled"}), with_ecc)[0].ok is False
    assert fc.compare_ecc_mode(smi_row(**{"ecc.mode.current": "Disabled"}), metrics())[0].ok
    assert fc.compare_ecc_mode(smi_row(**{"ecc.mode.current": "Enabled"}), metrics())[0].ok is False


def test_clock_event_reasons_agree_in_one_pair_with_the_idle_bit_aside() -> None:
    def pair(smi: str, agent: int) -> tuple:
        return smi_row(**{"clocks_event_reasons.active": smi}), metrics(
            series("gpumond_gpu_clocks_event_reasons_bitmask", agent))
    assert fc.compare_clock_events([pair("0x0000000000000001", 0)])[0].ok
    assert fc.compare_clock_events([pair("0x4", 0), pair("0x4", 4)])[0].ok
    assert fc.compare_clock_events([pair("0x4", 0), pair("0x4", 0)])[0].ok is False
    older = [(smi_row(**{"clocks_throttle_reasons.active": "0x4"}),
              metrics(series("gpumond_gpu_clocks_event_reasons_bitmask", 4)))]
    assert fc.compare_clock_events(older)[0].ok


def test_a_setting_changed_during_the_check_fails_it() -> None:
    before = smi_row(**{"power.limit": "700.00", "persistence_mode": "Enabled"})
    assert fc.settings_unchanged(before, smi_row(**{"power.limit": "700.00", "persistence_mode": "Enabled"}))[0].ok
    [check] = fc.settings_unchanged(before, smi_row(**{"power.limit": "600.00", "persistence_mode": "Enabled"}))
    assert check.ok is False and "power.limit: '700.00' → '600.00'" in check.detail


def test_the_policy_may_only_have_dry_run_actions() -> None:
    node = 'gpumond_policy_mode{mode="dry_run"} 1\n' + series("gpumond_policy_actions_total", 2, kind="dry_run")
    assert fc.policy_acted(metrics(node_lines=node))[0].ok
    acted = node + series("gpumond_policy_actions_total", 1, kind="set_limit")
    assert fc.policy_acted(metrics(node_lines=acted))[0].ok is False
    enforcing = 'gpumond_policy_mode{mode="enforce"} 1\n'
    assert fc.policy_acted(metrics(node_lines=enforcing))[0].ok is False


GOOD = {"idle": {"util": 0.0, "sm": 0.0, "occupancy": 0.0, "tensor": 0.0, "dram": 0.001},
        "tiny": {"util": 1.0, "sm": 0.008, "occupancy": 0.002, "tensor": 0.0, "dram": 0.001},
        "matmul": {"util": 1.0, "sm": 0.97, "occupancy": 0.2, "tensor": 0.7, "dram": 0.3}}


def test_the_three_loads_in_the_expected_order_pass() -> None:
    checks = fc.gpm_checks(GOOD)
    assert all(c.ok for c in checks), checks


@pytest.mark.parametrize(("load", "key", "value", "failing"), [
    ("tiny", "sm", 0.6, "tiny kernel: busy but doing little"),  # the busy-idle case not visible
    ("tiny", "util", 0.2, "tiny kernel: busy but doing little"),
    ("matmul", "tensor", 0.1, "matmul: tensor pipes busy"),
    ("idle", "sm", 0.3, "idle: SMs idle"),
    ("matmul", "dram", 0.0, "matmul: occupancy and DRAM above idle"),
])
def test_a_load_out_of_order_fails_its_check(load: str, key: str, value: float, failing: str) -> None:
    figures = {name: dict(f) for name, f in GOOD.items()}
    figures[load][key] = value
    assert [c.name for c in fc.gpm_checks(figures) if c.ok is False] == [failing]


def test_missing_gpm_figures_fail_once_naming_them() -> None:
    figures = {name: dict(f) for name, f in GOOD.items()}
    figures["matmul"]["tensor"] = None  # type: ignore[assignment]
    [check] = fc.gpm_checks(figures)
    assert check.ok is False and "matmul:tensor" in check.detail


def test_gpm_figures_are_medians_over_a_loads_scrapes() -> None:
    scrapes = [metrics(series("gpumond_gpu_sm_active_ratio", v) + series("gpumond_gpu_utilization_ratio", 1))
               for v in (0.1, 0.9, 0.2)]
    figures = fc.gpm_figures(scrapes, 0)
    assert figures["sm"] == 0.2 and figures["util"] == 1 and figures["tensor"] is None


def test_nvlink_present_or_absent_with_the_reason() -> None:
    up = metrics(series("gpumond_gpu_nvlink_up", 1, link="0") + series("gpumond_gpu_nvlink_up", 0, link="1"))
    assert "2 links reported, 1 up" in fc.nvlink_check(up, 0).detail
    assert "reports no links" in fc.nvlink_check(metrics(), 0).detail


def test_the_slow_rank_must_wait_least() -> None:
    waits = {0: [0.010, 0.012], 1: [0.001, 0.002], 2: [0.011, 0.009]}
    assert fc.separation_check(waits, 1).ok
    assert fc.separation_check(waits, 0).ok is False
    assert fc.separation_check({0: [0.01], 1: []}, 1).ok is False


def test_findings_must_name_the_slow_rank_and_nothing_else() -> None:
    seen = {("straggler", 1, "pending"): 5.0, ("straggler", 1, "firing"): 15.0}
    assert fc.findings_check(seen, [], 1).ok
    assert fc.findings_check(seen, [("straggler", 2, "firing")], 1).ok is False
    assert fc.findings_check({("straggler", 1, "pending"): 5.0}, [], 1).ok is False


def test_synchronising_calls_may_not_grow_with_the_sdk() -> None:
    without = {"cudaStreamSynchronize": 40, "cudaDeviceSynchronize": 0}
    assert fc.sync_check(dict(without), without, 20).ok
    assert fc.sync_check({"cudaStreamSynchronize": 40, "cudaDeviceSynchronize": 20}, without, 20).ok is False


def test_unsupported_calls_are_read_from_the_agents_log_once_each() -> None:
    line = ('ts=2026-11-28T21:29:16.578Z level=info logger=gpumond.nvml msg="nvml call not available" gpu=0 '
            'reader=retired_pages call=nvmlDeviceGetRetiredPages error=not_supported hint="skipped on this GPU"')
    assert fc.unsupported_from_log("\n".join([line, "other", line])) == [
        ("0", "retired_pages", "nvmlDeviceGetRetiredPages", "not_supported")]


def test_nvml_errors_the_agent_counted_are_reported() -> None:
    scrape = metrics(series("gpumond_nvml_errors_total", 2, call="nvmlGpmMetricsGet", error="invalid_argument")
                     + series("gpumond_nvml_errors_total", 0, call="nvmlDeviceGetPowerUsage", error="unknown"))
    check = fc.nvml_errors(scrape)
    assert check.ok is None
    assert check.detail == 'GPU 0 call="nvmlGpmMetricsGet",error="invalid_argument": 2'
    assert fc.nvml_errors(metrics()).detail == "none"


def test_what_only_nvidia_smi_shows_is_listed_per_gpu() -> None:
    rows = {0: {"index": "0", "pcie.link.gen.current": "5", "pcie.link.width.current": "16", "vbios_version": None}}
    assert fc.driver_only(rows) == "GPU 0: pcie.link.gen.current=5, pcie.link.width.current=16, vbios_version=N/A"


def test_series_without_an_nvidia_smi_field_are_listed() -> None:
    scrape = metrics(series("gpumond_gpu_sm_active_ratio", 0.5) + series("gpumond_gpu_temperature_celsius", 50))
    assert fc.not_compared(scrape) == ["gpumond_gpu_sm_active_ratio"]
