"""dcgm-exporter-compatible series: the core DCGM_FI_DEV_* fields under dcgm-exporter's names, units and labels.

Off by default (`exposition.dcgm_compat.enabled`). The values are the very reads the gpumond series come from
(the same TierRead, through the same catalogue machinery), so the two names never disagree; only the
catalogue (`dcgm_fields.csv`, in NVML's own units, which are dcgm-exporter's) and the labels differ.

Pod labels follow dcgm-exporter's pod mapper (internal/pkg/transformation/kubernetes.go): every series of a
GPU the kubelet assigned to a container carries `pod`, `namespace`, `container`. A GPU several containers
share (time-slicing) repeats each series once per container, as its `--kubernetes-virtual-gpus` mode does,
rather than naming one of them arbitrarily as its default mode does. MIG devices are assigned by MIG UUID,
so a MIG-enabled GPU's own series carry no pod, as in dcgm-exporter. Each GPU instance's profiling fields
(`mig_series`, from GPM per instance) carry dcgm-exporter's `GPU_I_PROFILE` and `GPU_I_ID` and the pods the
kubelet assigned that instance.

With `exposition.nvlink_per_link`, each link's error counters are exported too, under DCGM's per-link field
names (`DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0` … `_L17`, one metric name per link, as dcgm-exporter names
any field: no `link` label), from `dcgm_nvlink_links.csv`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from importlib import resources

from gpumond.agent import gpu_series
from gpumond.agent.podresources.assign import PodRef
from gpumond.nvml.catalogue import Field, load_catalogue
from gpumond.nvml.mig import MigIdentity
from gpumond.nvml.session import GpuIdentity, TierRead
from gpumond.types import Labels, Series

def _catalogue(name: str) -> tuple[Field, ...]:
    return load_catalogue(resources.files("gpumond.agent").joinpath(name).read_text(encoding="utf-8"), name)


DCGM_CATALOGUE: tuple[Field, ...] = _catalogue("dcgm_fields.csv")
DCGM_LINK_CATALOGUE: tuple[Field, ...] = _catalogue("dcgm_nvlink_links.csv")  # with exposition.nvlink_per_link
_INDEX = gpu_series.index_fields(DCGM_CATALOGUE)
_INDEX_PER_LINK = gpu_series.index_fields(DCGM_CATALOGUE + DCGM_LINK_CATALOGUE)
_DIVISOR = gpu_series.divisors(DCGM_CATALOGUE)
# The profiling fields DCGM reports per GPU instance: the activity ratios. PCIe and NVLink bytes belong to the
# board's links, not to an instance, and stay on the GPU's own series.
MIG_PROF_KEYS = frozenset({"graphics", "sm", "occupancy", "tensor_any", "dram", "fp64", "fp32", "fp16"})
# (metric, GPM key, divisor): GPM percentages as dcgm-exporter's ratios.
_MIG_ROWS = tuple((f.metric, f.key, _DIVISOR[f.scale]) for f in DCGM_CATALOGUE
                  if f.reader == "gpm" and f.key in MIG_PROF_KEYS and f.scale is not None)

XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
HOSTNAME_LABELS = ("Hostname", "hostname")  # released dcgm-exporter; its main branch (no release yet)


def dcgm_types() -> dict[str, tuple[str, str]]:
    """Every dcgm-compatible metric name → (type, help), for the encoder's HELP/TYPE lines."""
    out = {f.metric: (f.type, f.help) for f in DCGM_CATALOGUE + DCGM_LINK_CATALOGUE}
    out[XID_METRIC] = ("gauge", "Value of the last XID error encountered (0: none since the agent started).")
    return out


def dcgm_labels(ident: GpuIdentity, *, hostname: str, hostname_label: str, driver_version: str | None) -> Labels:
    """dcgm-exporter's label set for one GPU (`device` is nvidia<minor>, as in /dev)."""
    minor = ident.index if ident.minor is None else ident.minor
    labels: Labels = (("gpu", str(ident.index)), ("UUID", ident.uuid), ("pci_bus_id", ident.pci_bus_id),
                      ("device", f"nvidia{minor}"), ("modelName", ident.name), (hostname_label, hostname))
    if driver_version:
        labels += (("DCGM_FI_DRIVER_VERSION", driver_version),)
    return labels


def pod_labels(ref: PodRef) -> Labels:
    """dcgm-exporter's attribute labels for a container (after its own labels, as its template prints them)."""
    return (("container", ref.container), ("namespace", ref.namespace), ("pod", ref.pod))


class DcgmCompat:
    """Turns a tier's read and the XID watcher's last codes into dcgm-exporter-named series."""

    def __init__(self, *, hostname: str, hostname_label: str = "Hostname", per_link: bool = False) -> None:
        if hostname_label not in HOSTNAME_LABELS:
            raise ValueError(f"hostname_label must be one of {', '.join(HOSTNAME_LABELS)}")
        self._index = _INDEX_PER_LINK if per_link else _INDEX
        self._hostname = hostname
        self._hostname_label = hostname_label
        self._labels: dict[tuple[GpuIdentity, str | None], Labels] = {}
        self._pods: dict[str, tuple[Labels, ...]] = {}

    def set_pods(self, pods: Mapping[str, tuple[PodRef, ...]] | None) -> None:
        """The containers the kubelet assigned each GPU UUID, from the slow cycle (None: unknown, no labels)."""
        # One swap of a new dict: the fast cycle may read it from another thread at any moment.
        self._pods = {uuid: tuple(pod_labels(r) for r in refs) for uuid, refs in (pods or {}).items() if refs}

    def labels(self, ident: GpuIdentity, driver_version: str | None) -> Labels:
        """dcgm_labels, built once per (GPU, driver) since they never change between cycles."""
        key = (ident, driver_version)
        got = self._labels.get(key)
        if got is None:
            if len(self._labels) > 4096:  # identities churn only on re-init; bound it anyway
                self._labels.clear()
            got = self._labels[key] = dcgm_labels(ident, hostname=self._hostname,
                                                  hostname_label=self._hostname_label,
                                                  driver_version=driver_version)
        return got

    def tier_series(self, read: TierRead, driver_version: str | None) -> list[Series]:
        """The DCGM_FI_DEV_* series of one tier's read (a lost GPU exports none, as in gpumond's own)."""
        sets: dict[str, tuple[Labels, ...]] = {}
        out = gpu_series.field_series(read, self._index, _DIVISOR, lambda i: self._first(i, driver_version, sets))
        return self._shared(out, sets)

    def mig_series(self, migs: Iterable[MigIdentity], activity: Mapping[str, Mapping[str, float]],
                   idents: Mapping[int, GpuIdentity], driver_version: str | None) -> list[Series]:
        """DCGM_FI_PROF_* activity of each GPU instance, labelled as dcgm-exporter labels one: the parent GPU's
        labels plus `GPU_I_PROFILE` and `GPU_I_ID`, and the pods of the instance's MIG devices.

        One series set per GPU instance, as DCGM's entity is the instance: its compute instances (MIG devices
        sharing the GPU instance id) read the same GPM sample, so the first one read stands for them all.
        """
        by_instance: dict[tuple[int, int], tuple[MigIdentity, Mapping[str, float], list[Labels]]] = {}
        for m in migs:
            parent = idents.get(m.parent_index)
            values = activity.get(m.uuid)
            if parent is None or not values:
                continue
            key = (m.parent_index, m.gpu_instance)
            entry = by_instance.get(key)
            if entry is None:
                entry = by_instance[key] = (m, values, [])
            entry[2].extend(p for p in self._pods.get(m.uuid, ()) if p not in entry[2])
        out: list[Series] = []
        for (index, _), (m, values, pods) in by_instance.items():
            base = self.labels(idents[index], driver_version) + (("GPU_I_PROFILE", m.profile),
                                                                 ("GPU_I_ID", str(m.gpu_instance)))
            for labels in [base + p for p in pods] or [base]:
                out.extend(Series(metric, labels, values[key] / divisor)
                           for metric, key, divisor in _MIG_ROWS if key in values)
        return out

    def xid_series(self, last: Mapping[int, int], idents: Iterable[GpuIdentity],
                   driver_version: str | None) -> list[Series]:
        """DCGM_FI_DEV_XID_ERRORS: the last XID code per GPU, 0 when it had none (dcgm-exporter's gauge)."""
        sets: dict[str, tuple[Labels, ...]] = {}
        out = [Series(XID_METRIC, self._first(i, driver_version, sets), float(last.get(i.index, 0))) for i in idents]
        return self._shared(out, sets)

    def _first(self, ident: GpuIdentity, driver_version: str | None, sets: dict[str, tuple[Labels, ...]]) -> Labels:
        """The GPU's first label set (with its first container's pod labels); records them all in `sets`."""
        base = self.labels(ident, driver_version)
        held = self._pods.get(ident.uuid)
        got = sets[ident.uuid] = (base,) if held is None else tuple(base + h for h in held)
        return got[0]

    @staticmethod
    def _shared(series: list[Series], sets: Mapping[str, tuple[Labels, ...]]) -> list[Series]:
        """`series`, each repeated once per container on a GPU several containers share (time-slicing)."""
        if all(len(v) == 1 for v in sets.values()):
            return series  # the usual case: one series per GPU and field, labels already complete
        out: list[Series] = []
        for s in series:
            label_sets = sets[s.labels[1][1]]  # ("UUID", uuid): dcgm_labels puts it second
            if len(label_sets) == 1:
                out.append(s)
                continue
            cut = len(label_sets[0])  # anything after the GPU's labels is the field's own
            out.extend(Series(s.name, ls + s.labels[cut:], s.value) for ls in label_sets)
        return out
