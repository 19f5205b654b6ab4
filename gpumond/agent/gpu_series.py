"""Pure conversion of raw NVML reads into catalogued series (pure: tested on literal reads)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from gpumond.agent.attribution import DeviceJob
from gpumond.nvml.catalogue import CATALOGUE, CLOCK_EVENT_REASONS, LINK_CATALOGUE, Field
from gpumond.nvml.mig import MigIdentity
from gpumond.nvml.session import GpuIdentity, TierRead
from gpumond.types import Labels, Series

FieldIndex = Mapping[tuple[str, str], Sequence[Field]]


def index_fields(fields: Iterable[Field]) -> dict[tuple[str, str], list[Field]]:
    """(reader, key) → the catalogue rows that export it, so a read value finds its series in one lookup."""
    out: dict[tuple[str, str], list[Field]] = {}
    for f in fields:
        out.setdefault((f.reader, f.key), []).append(f)
    return out


def divisors(fields: Iterable[Field]) -> dict[float, float]:
    """scale → the exact integer to divide by, for every scale below 1."""
    return {f.scale: float(round(1 / f.scale)) for f in fields if f.scale is not None and f.scale < 1}


_BY_READER_KEY = index_fields(CATALOGUE)
_BY_READER_KEY_PER_LINK = index_fields(CATALOGUE + LINK_CATALOGUE)  # with `exposition.nvlink_per_link`
_DIVISOR = divisors(CATALOGUE + LINK_CATALOGUE)


LINK_SUFFIX = "@link"  # a catalogue key `x@link` exports each read key `x@N` with the label link="N"


def _per_link(index: FieldIndex, reader: str, key: str) -> tuple[Sequence[Field], Labels]:
    """The rows of a per-link key (`replay@3` → the `replay@link` rows) and its `link` label."""
    name, sep, link = key.rpartition("@")
    if not sep:
        return (), ()
    return index.get((reader, name + LINK_SUFFIX), ()), (("link", link),)


def gpu_labels(ident: GpuIdentity) -> Labels:
    """The labels every per-GPU series carries."""
    return (("gpu", str(ident.index)), ("uuid", ident.uuid))


def field_series(read: TierRead, index: FieldIndex, divisor: Mapping[float, float],
                 labels_for: Callable[[GpuIdentity], Labels]) -> list[Series]:
    """Series of every readable GPU's values for the catalogue rows in `index`, labelled by `labels_for`."""
    out: list[Series] = []
    for g in read.gpus:
        if not g.up:
            continue  # a lost GPU exports nothing stale
        base = labels_for(g.identity)
        for reader, vals in g.values:
            for key, value in vals.items():
                fields = index.get((reader, key))
                labels = base
                if fields is None:  # not a plain key: maybe one link's value
                    fields, link = _per_link(index, reader, key)
                    labels = base + link
                for f in fields:
                    if f.scale is None:
                        mask = int(value)
                        for bit, reason in CLOCK_EVENT_REASONS.items():
                            out.append(Series(f.metric, labels + (("reason", reason),), 1.0 if mask & bit else 0.0))
                    elif f.scale < 1:
                        # divide by the exact integer (100, 1000, 1e9) so 95 % is 0.95, not 0.9500000000000001
                        out.append(Series(f.metric, labels + f.labels, value / divisor[f.scale]))
                    else:
                        out.append(Series(f.metric, labels + f.labels, value * f.scale))
    return out


def tier_series(read: TierRead, *, with_up: bool, per_link: bool = False) -> list[Series]:
    """Series for one tier's read; `with_up` adds gpumond_gpu_up (only the fast tier says it), `per_link` each
    NVLink's counters (LINK_CATALOGUE) beside the per-GPU totals."""
    out: list[Series] = []
    if with_up:
        out.append(Series("gpumond_nvml_up", (), 1.0 if read.nvml_up else 0.0))
        out.extend(Series("gpumond_gpu_up", gpu_labels(g.identity), 1.0 if g.up else 0.0) for g in read.gpus)
    out.extend(field_series(read, _BY_READER_KEY_PER_LINK if per_link else _BY_READER_KEY, _DIVISOR, gpu_labels))
    return out


def info_series(idents: Iterable[GpuIdentity], hostname: str) -> list[Series]:
    """gpumond_gpu_info for every GPU ever seen (lost ones keep their identity)."""
    return [
        Series("gpumond_gpu_info", gpu_labels(i) + (("name", i.name), ("pci_bus_id", i.pci_bus_id),
                                                    ("hostname", hostname)), 1.0)
        for i in idents
    ]


def xid_series(counts: Mapping[tuple[int, int], int], idents: Mapping[int, GpuIdentity]) -> list[Series]:
    """gpumond_gpu_xid_errors_total{xid} from the watcher's counts."""
    out = []
    for (index, xid), n in sorted(counts.items()):
        ident = idents.get(index)
        if ident is not None:
            out.append(Series("gpumond_gpu_xid_errors_total", gpu_labels(ident) + (("xid", str(xid)),), float(n)))
    return out


def error_series(errors: Mapping[tuple[int, str, str], int], idents: Mapping[int, GpuIdentity]) -> list[Series]:
    """gpumond_nvml_errors_total{call,error}: retried NVML failures, counted."""
    out = []
    for (index, call, err), n in sorted(errors.items()):
        ident = idents.get(index)
        if ident is not None:
            out.append(Series("gpumond_nvml_errors_total",
                              gpu_labels(ident) + (("call", call), ("error", err)), float(n)))
    return out


def mig_labels(m: MigIdentity) -> Labels:
    """The labels every per-MIG-device series carries: its parent's `gpu` and `uuid`, then the instance."""
    return (("gpu", str(m.parent_index)), ("uuid", m.parent_uuid), ("mig_uuid", m.uuid),
            ("gpu_instance", str(m.gpu_instance)), ("compute_instance", str(m.compute_instance)),
            ("profile", m.profile))


def mig_info_series(migs: Iterable[MigIdentity]) -> list[Series]:
    """gpumond_gpu_mig_info: each MIG device and its parent GPU (the rules service joins MIG ranks on it)."""
    return [Series("gpumond_gpu_mig_info", mig_labels(m), 1.0) for m in migs]


def mig_memory_series(migs: Iterable[MigIdentity], memory: Mapping[str, tuple[float, float]]) -> list[Series]:
    """Per-instance framebuffer memory used and total; an instance not read this cycle is left out."""
    out = []
    for m in migs:
        read = memory.get(m.uuid)
        if read is not None:
            labels = mig_labels(m)
            out.append(Series("gpumond_gpu_mig_memory_used_bytes", labels, read[0]))
            out.append(Series("gpumond_gpu_mig_memory_total_bytes", labels, read[1]))
    return out


# GPM's per-instance metrics (read key → series); the whole GPU's come from the catalogue (reader "gpm").
MIG_ACTIVITY: tuple[tuple[str, str, Labels], ...] = (
    ("sm", "gpumond_gpu_mig_sm_active_ratio", ()),
    ("occupancy", "gpumond_gpu_mig_sm_occupancy_ratio", ()),
    ("tensor_any", "gpumond_gpu_mig_tensor_active_ratio", (("precision", "any"),)),
    ("dram", "gpumond_gpu_mig_dram_active_ratio", ()),
)


def mig_activity_series(migs: Iterable[MigIdentity], activity: Mapping[str, Mapping[str, float]]) -> list[Series]:
    """Per-instance SM, occupancy, tensor and DRAM activity (GPM percentages as ratios); unread instances left out."""
    out = []
    for m in migs:
        values = activity.get(m.uuid)
        if not values:
            continue
        labels = mig_labels(m)
        out.extend(Series(metric, labels + extra, values[key] / 100.0)
                   for key, metric, extra in MIG_ACTIVITY if key in values)
    return out


def _job_labels(row: DeviceJob) -> Labels:
    labels: Labels = (("job", row.job),)
    if row.pod is not None:
        labels += (("pod", row.pod.pod), ("namespace", row.pod.namespace), ("container", row.pod.container))
    return labels


def job_series(jobs: Mapping[str, tuple[DeviceJob, ...]], idents: Mapping[int, GpuIdentity],
               migs: Iterable[MigIdentity] = ()) -> list[Series]:
    """gpumond_gpu_job_info 1 for each job on each GPU and MIG device (keyed by UUID), with `pod`,
    `namespace`, `container` when the kubelet named the device's pod; MIG rows carry the MIG labels."""
    out = []
    for ident in sorted(idents.values(), key=lambda i: i.index):
        out.extend(Series("gpumond_gpu_job_info", gpu_labels(ident) + _job_labels(r), 1.0)
                   for r in jobs.get(ident.uuid, ()))
    for m in migs:
        out.extend(Series("gpumond_gpu_job_info", mig_labels(m) + _job_labels(r), 1.0) for r in jobs.get(m.uuid, ()))
    return out
