"""NVML reads built from (reader, key, value) triples, and series read back by name: for the series builders' tests."""


def read_of(*triples):
    """GpuRead values from (reader, key, value) triples."""
    grouped = {}
    for r, k, v in triples:
        grouped.setdefault(r, {})[k] = v
    return tuple(grouped.items())


def by_name(series):
    """{metric name: [(labels, value), …]}."""
    out = {}
    for s in series:
        out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out
