"""One NVML field value decoded by its declared type (the union member NVML filled)."""

import pynvml
import pytest

from gpumond.nvml.reader import field_value


@pytest.mark.parametrize("value_type, member, value", [
    (pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal", 1.5),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 4_000_000_000),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG, "ulVal", 7),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", 2**40),
    (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", -(2**40)),
    (pynvml.NVML_VALUE_TYPE_SIGNED_INT, "siVal", -3),
    (pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT, "usVal", 65535),
])
def test_each_value_type_is_read_from_its_own_union_member(value_type, member, value):
    entry = pynvml.c_nvmlFieldValue_t()
    entry.valueType = value_type
    setattr(entry.value, member, value)
    assert field_value(entry) == float(value)
