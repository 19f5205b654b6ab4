import pytest

from gpumond.nvml.calls import READERS
from gpumond.nvml.catalogue import CATALOGUE, load_catalogue

BASE_UNITS = ("_celsius", "_watts", "_joules_total", "_hertz", "_bytes", "_ratio", "_seconds_total",
              "_errors_total", "_info", "_active", "_rows", "_pending", "_failed", "_pages", "_bytes_total",
              "_bytes_per_second", "_up", "_bitmask")


def test_every_row_names_a_reader_key_that_exists_and_a_base_unit():
    readers = {r.name for r in READERS}
    for f in CATALOGUE:
        assert f.reader in readers
        assert f.metric.startswith("gpumond_gpu_")
        assert f.metric.endswith(BASE_UNITS), f.metric
        assert "_mhz" not in f.metric and "_percent" not in f.metric
        assert (f.type == "counter") == f.metric.endswith("_total"), f.metric


def test_same_metric_rows_share_type_help_and_label_names():
    seen = {}
    for f in CATALOGUE:
        key = (f.type, f.help, tuple(k for k, _ in f.labels))
        assert seen.setdefault(f.metric, key) == key, f.metric


@pytest.mark.parametrize("bad, message", [
    ("m,gauge,nope,k,1,,fast,h", "unknown reader 'nope'"),
    ("m,histogram,temperature,gpu,1,,fast,h", "type must be gauge or counter"),
    ("m,gauge,temperature,gpu,1,,slow,h", "tier 'slow' differs"),
])
def test_bad_rows_are_rejected_with_the_line_number(bad, message):
    text = "metric,type,reader,key,scale,labels,tier,help\n" + bad
    with pytest.raises(ValueError, match=message) as e:
        load_catalogue(text)
    assert "line 2" in str(e.value)
