import gzip

from prometheus_client.parser import text_string_to_metric_families

from gpumond.agent.exposition import Renderer
from gpumond.agent.readings import Series, Snapshot, SourceResult
from gpumond.agent.sources import PartialFailure, run_source, self_series

L0 = (("gpu", "0"), ("uuid", "GPU-a"))


def families(data: bytes):
    return {f.name: f for f in text_string_to_metric_families(data.decode())}


def test_render_groups_families_and_types_counters_and_gzip_matches_plain():
    snap = Snapshot(1.0, (
        SourceResult("nvml_fast", True, 0.001, (
            Series("gpumond_gpu_temperature_celsius", L0, 70.0),
            Series("gpumond_gpu_energy_joules_total", L0, 10.5),
            Series("gpumond_gpu_temperature_celsius", (("gpu", "1"), ("uuid", "GPU-b")), 71.0))),
    ))
    r = Renderer().render(snap)
    assert gzip.decompress(r.gzipped) == r.plain
    fams = families(r.plain)
    assert fams["gpumond_gpu_temperature_celsius"].type == "gauge"
    assert len(fams["gpumond_gpu_temperature_celsius"].samples) == 2
    energy = fams["gpumond_gpu_energy_joules"]
    assert energy.type == "counter" and energy.samples[0].name == "gpumond_gpu_energy_joules_total"
    assert b"# HELP gpumond_gpu_temperature_celsius GPU die temperature." in r.plain


def test_a_failing_source_is_isolated_and_reported():
    def boom():
        raise RuntimeError("psutil exploded")

    ok = run_source("nvml_fast", lambda: [Series("gpumond_gpu_up", L0, 1.0)])
    bad = run_source("host", boom)
    partial = run_source("xid", lambda: (_ for _ in ()).throw(
        PartialFailure("thread died", [Series("gpumond_gpu_xid_errors_total", L0 + (("xid", "79"),), 1.0)])))
    assert ok.ok and not bad.ok and "psutil exploded" in bad.error
    assert not partial.ok and len(partial.series) == 1
    r = Renderer().render(Snapshot(0.0, (ok, bad, partial)), self_series([ok, bad, partial]))
    fams = families(r.plain)
    success = {s.labels["collector"]: s.value for s in fams["gpumond_collector_success"].samples}
    assert success == {"nvml_fast": 1.0, "host": 0.0, "xid": 0.0}
    assert fams["gpumond_gpu_up"].samples[0].value == 1.0
    assert fams["gpumond_gpu_xid_errors"].samples[0].value == 1.0
