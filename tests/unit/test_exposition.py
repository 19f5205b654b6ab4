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


# ----- the cached-prefix encoder writes exactly what prometheus-client writes ---------------------------
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gpumond.wire.safetext import UNSAFE

NAMES = ["gpumond_gpu_temperature_celsius", "gpumond_gpu_energy_joules_total", "gpumond_gpu_info",
         "gpumond_nvml_up", "gpumond_gpu_xid_errors_total"]
LABEL_NAMES = ["gpu", "uuid", "reason", "job"]
values = st.one_of(st.floats(allow_nan=False), st.just(float("inf")), st.just(float("-inf")),
                   st.integers(-10**18, 10**18).map(float))
# Unsafe characters (gpumond.wire.safetext) are escaped on purpose beyond what prometheus-client does (tested in
# test_safe_labels.py); everything else must come out byte for byte the same.
label_values = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12).filter(
    lambda v: UNSAFE.search(v.replace("\n", "")) is None)


def reference(series, types):
    class C:
        def describe(self):
            return []

        def collect(self):
            fams = {}
            for s in sorted(series, key=lambda s: s.name):
                if s.name not in fams:
                    kind, help_ = types.get(s.name, ("gauge", ""))
                    names = [k for k, _ in s.labels]
                    fams[s.name] = (CounterMetricFamily(s.name.removesuffix("_total"), help_, labels=names)
                                    if kind == "counter" else GaugeMetricFamily(s.name, help_, labels=names))
                fams[s.name].add_metric([v for _, v in s.labels], s.value)
            yield from fams.values()

    reg = CollectorRegistry(auto_describe=False)
    reg.register(C())
    return generate_latest(reg)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(NAMES), st.lists(label_values, min_size=2, max_size=2), values),
                max_size=30))
def test_encoder_is_byte_identical_to_prometheus_client(rows):
    from gpumond.agent.metrics import metric_types

    series = [Series(name, tuple(zip(LABEL_NAMES[:2], lv, strict=True)), v) for name, lv, v in rows]
    r = Renderer()
    assert r.encode(series) == reference(series, metric_types())
    assert r.encode(series) == reference(series, metric_types())  # and again from the warm cache


def test_an_undeclared_metric_is_left_out_and_logged_once(caplog) -> None:
    from gpumond.textformat import Encoder

    enc = Encoder({"declared": ("gauge", "A declared gauge.")})
    series = [Series("declared", (), 1.0), Series("oops_undeclared", (("gpu", "0"),), 2.0),
              Series("oops_undeclared", (("gpu", "1"),), 3.0)]
    with caplog.at_level("ERROR", logger="gpumond"):
        assert enc.encode(series) == b"# HELP declared A declared gauge.\n# TYPE declared gauge\ndeclared 1.0\n"
        enc.encode(series)
    assert enc.undeclared == {"oops_undeclared"}
    assert [r.getMessage() for r in caplog.records].count("series not exported: its metric is not declared") == 1
