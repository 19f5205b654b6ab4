"""One NVML session: initialise once, probe what each GPU supports, read tiers, survive lost GPUs."""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pynvml

from gpumond.nvml.calls import build_readers
from gpumond.nvml.reader import Call, Reader
from gpumond.nvml.errors import HINTS, Disposition, classify, error_name
from gpumond.nvml.gpm import GpmSampler
from gpumond.nvml import mig as miglib
from gpumond.nvml.mig import MigIdentity
from gpumond.wire.retry import Backoff

log = logging.getLogger("gpumond.nvml")

_FIRST_BACKOFF_S = 2.0
# A lost GPU is probed again after 2, 4, 8, 8, 8… s: a GPU that answers again is up in the first fast cycle
# after its next probe, so at most LOST_RETRY_MAX_S + one fast interval after it came back. A probe of a lost
# GPU is one handle lookup, cheap enough not to need a longer back-off.
LOST_RETRY_MAX_S = 8.0
# "Not supported" / "no permission" learnt from one answer may be transient (a driver busy resetting, a
# capability briefly dropped): such a reader is probed again after this, doubling up to retry_max_s.
_FIRST_REPROBE_S = 10.0
# A reader that has answered on a GPU is not given up after one refusal: it is tried again on the next
# cycles, and only after this many refusals in a row is it treated as unsupported (and re-probed).
_MISSES_BEFORE_UNSUPPORTED = 3


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """What names a GPU in every exported series."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    minor: int | None = None  # /dev/nvidia<minor>; None where the driver cannot say (dcgm-compat's `device`)


@dataclass(frozen=True, slots=True)
class GpuRead:
    """One tier's raw values for one GPU: per reader, its values in NVML units (read-only mappings)."""

    identity: GpuIdentity
    up: bool
    values: tuple[tuple[str, Mapping[str, float]], ...] = ()

    def triples(self) -> Iterator[tuple[str, str, float]]:
        """(reader, key, value) for every value read."""
        for reader, vals in self.values:
            for key, value in vals.items():
                yield reader, key, value


@dataclass(frozen=True, slots=True)
class TierRead:
    """One tier's reads for every GPU, and whether NVML itself was usable."""

    nvml_up: bool
    gpus: tuple[GpuRead, ...]
    error: str | None = None


@dataclass(slots=True)
class _GpuState:
    identity: GpuIdentity
    handle: Any
    choice: dict[str, int] = field(default_factory=dict)  # reader → index of the call that worked
    unsupported: dict[str, float] = field(default_factory=dict)  # reader → when to probe it again
    reprobe: dict[str, Backoff] = field(default_factory=dict)  # reader → its re-probe back-off while refused
    answered: set[str] = field(default_factory=set)  # readers that returned a value on this GPU
    misses: dict[str, int] = field(default_factory=dict)  # reader → refusals in a row since it answered
    plans: dict[str, list[tuple[Reader, Call]]] = field(default_factory=dict)  # tier → calls to make
    # compute_pids is not a tier reader: its own back-off, so `unsupported` holds readers only and the
    # tier read path re-probes only while a reader is really out.
    processes_due: float = float("-inf")  # when to ask for compute processes again
    processes_retry: Backoff | None = None  # its back-off; None while it answers

    def forget_support(self) -> None:
        """A new handle (re-init, GPU back): learn what it supports from scratch."""
        self.choice, self.unsupported, self.reprobe, self.plans = {}, {}, {}, {}
        self.answered, self.misses = set(), {}
        self.processes_due, self.processes_retry = float("-inf"), None
    lost: bool = False
    next_retry: float = 0.0
    lost_retry: Backoff = field(default_factory=lambda: Backoff(_FIRST_BACKOFF_S, LOST_RETRY_MAX_S, jitter=0.0))
    # False while the identity is only what this index had when last seen (a GPU lost since start): it is
    # found again by index and read afresh, not trusted by UUID.
    verified: bool = True


class SetFailed(RuntimeError):
    """A power-limit change did not take; `kind` is no_permission | invalid | gpu_lost | not_applied | …"""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


_SET_KIND = {
    Disposition.NO_PERMISSION: "no_permission",
    Disposition.GPU_LOST: "gpu_lost",
    Disposition.UNSUPPORTED: "not_supported",
}


class NvmlSession:
    """The agent's only door to NVML; every read goes through one error policy (see errors.py)."""

    def __init__(
        self,
        *,
        install: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        retry_max_s: float = 300.0,
        readers: tuple[Reader, ...] | None = None,
        remembered: Mapping[int, GpuIdentity] | None = None,
    ) -> None:
        self._install = install
        # Identities by index from an earlier run: a GPU already lost at start keeps its name (and its alerts
        # their identity) until it answers and is read afresh.
        self._remembered = dict(remembered or {})
        self._clock = clock
        self._retry_max_s = retry_max_s
        # The GPM sampler is the "gpm" reader's state, shared with the per-MIG-instance reads (read_mig_gpm).
        self._gpm = GpmSampler()
        self._readers = readers if readers is not None else build_readers(self._gpm)
        self._gpm_mig_unsupported: set[int] = set()  # GPU indexes whose instances GPM cannot sample
        self._lock = threading.RLock()
        self._gpus: list[_GpuState] = []
        self._up = False
        self._down_reason: str | None = None
        self._next_init = 0.0
        # Re-initialisation after NVML went down: 2 s doubling up to retry_max_s (a node's own driver: no jitter).
        self._init_retry = Backoff(_FIRST_BACKOFF_S, retry_max_s, jitter=0.0)
        self._said: set[tuple[Any, ...]] = set()
        self.errors_total: Counter[tuple[int, str, str]] = Counter()  # (gpu, symbol, error) → count
        self.driver_version: str | None = None
        self._migs: dict[int, list[tuple[MigIdentity, Any]]] = {}  # GPU index → its MIG devices

    # ----- lifecycle -----------------------------------------------------------------------------
    def open(self) -> None:
        """Initialise NVML and enumerate GPUs; on failure stay down, log once, and retry on reads."""
        with self._lock:
            self._install()
            self._try_init()

    def close(self) -> None:
        """Shut NVML down; safe to call twice."""
        with self._lock:
            if self._up:
                for g in self._gpus:
                    self._release(g)
                try:
                    pynvml.nvmlShutdown()
                except pynvml.NVMLError as e:
                    log.debug("nvmlShutdown failed", extra={"error": str(e)})
            self._up = False

    @property
    def up(self) -> bool:
        """True while NVML is initialised."""
        return self._up

    @property
    def down_reason(self) -> str | None:
        """Why NVML is unusable, for /healthz and logs."""
        return self._down_reason

    @property
    def identities(self) -> tuple[GpuIdentity, ...]:
        """Every GPU seen since start, lost ones included."""
        return tuple(g.identity for g in self._gpus)

    def _try_init(self) -> None:
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            try:
                self.driver_version = str(pynvml.nvmlSystemGetDriverVersion())
            except pynvml.NVMLError:
                self.driver_version = None
            known = {g.identity.index: g for g in self._gpus}
            gpus = []
            for i in range(count):
                prev = known.get(i)
                try:
                    h = pynvml.nvmlDeviceGetHandleByIndex(i)
                    ident = self._identity(i, h)
                except pynvml.NVMLError as e:
                    if classify(e) is not Disposition.GPU_LOST:
                        raise
                    # One GPU off the bus is that GPU down, not the node: the others are read, and this one
                    # is probed again like any lost GPU (by index until it is read in this run).
                    if prev is None:
                        last_run = self._remembered.get(i)
                        prev = _GpuState(last_run if last_run is not None and last_run.index == i
                                         else GpuIdentity(i, "", "", ""), None, verified=False)
                    self._mark_lost(prev, "nvmlDeviceGetHandleByIndex")
                    gpus.append(prev)
                    continue
                if prev is not None:
                    self._release(prev)  # what readers held for the old handle
                if prev is not None and prev.identity.uuid == ident.uuid:
                    prev.handle, prev.lost, prev.verified = h, False, True
                    prev.forget_support()
                    gpus.append(prev)
                else:
                    gpus.append(_GpuState(ident, h))
            self._gpus = gpus
            self._up = True
            self._down_reason = None
            self._init_retry.reset()
            self._migs = {}  # MIG handles do not survive a re-initialisation
            self._gpm_mig_unsupported = set()
            log.info("nvml initialised", extra={"gpus": count, "driver": self.driver_version})
        except pynvml.NVMLError as e:
            self._go_down(e)
            return
        self._discover_mig()

    def _go_down(self, e: pynvml.NVMLError) -> None:
        d = classify(e)
        reason = f"{error_name(e)}: {HINTS.get(d, str(e))}"
        if reason != self._down_reason:
            log.error("nvml unavailable", extra={"error": error_name(e), "hint": HINTS.get(d, str(e))})
        self._down_reason = reason
        self._up = False
        for g in self._gpus:
            g.lost = True
        self._next_init = self._clock() + self._init_retry.next_delay()

    def _identity(self, index: int, h: Any) -> GpuIdentity:
        def text(fn: Callable[[Any], Any]) -> str:
            try:
                v = fn(h)
                return v.decode() if isinstance(v, bytes) else str(v)
            except pynvml.NVMLError as e:
                if classify(e) is Disposition.GPU_LOST:
                    raise
                return ""

        bus = ""
        try:
            pci = pynvml.nvmlDeviceGetPciInfo(h)
            bus = pci.busId.decode() if isinstance(pci.busId, bytes) else str(pci.busId)
        except pynvml.NVMLError:
            pass
        minor = None
        try:
            minor = int(pynvml.nvmlDeviceGetMinorNumber(h))
        except pynvml.NVMLError:
            pass
        return GpuIdentity(index, text(pynvml.nvmlDeviceGetUUID), text(pynvml.nvmlDeviceGetName), bus, minor)

    # ----- reading -------------------------------------------------------------------------------
    def read(self, tier: str) -> TierRead:
        """Read every supported value of `tier` from every GPU; one GPU's failure never affects another."""
        with self._lock:
            if not self._up:
                if self._clock() >= self._next_init:
                    self._try_init()
                if not self._up:
                    down = tuple(GpuRead(g.identity, False) for g in self._gpus)
                    return TierRead(False, down, self._down_reason)
            out = []
            for g in self._gpus:
                out.append(self._read_gpu(g, tier))
                if not self._up:  # a driver-wide failure surfaced on this GPU
                    return TierRead(False, tuple(GpuRead(x.identity, False) for x in self._gpus),
                                    self._down_reason)
            return TierRead(True, tuple(out))

    def _plan(self, g: _GpuState, tier: str) -> list[tuple[Reader, Call]]:
        plan = g.plans.get(tier)
        if plan is None:
            plan = [(r, r.calls[g.choice.get(r.name, 0)]) for r in self._readers
                    if r.tier == tier and r.name not in g.unsupported]
            g.plans[tier] = plan
        return plan

    def _read_gpu(self, g: _GpuState, tier: str) -> GpuRead:
        """The hot path: one call per planned reader; every failure goes to _recover_call."""
        if g.lost and not self._recover(g):
            return GpuRead(g.identity, False)
        handle = g.handle
        values: list[tuple[str, Mapping[str, float]]] = []
        answered, misses = g.answered, g.misses
        for reader, call in self._plan(g, tier):
            try:
                vals = call.fn(handle)
            except Exception as e:  # noqa: BLE001 - classified in _recover_call
                vals = self._recover_call(g, reader, e)
                if g.lost or not self._up:
                    return GpuRead(g.identity, False)
                if vals is None:
                    continue
            else:
                # "Refusals in a row": any good read starts the count again, so isolated refusals
                # between good reads never add up to "unsupported".
                if misses:
                    misses.pop(reader.name, None)
            answered.add(reader.name)
            values.append((reader.name, MappingProxyType(vals)))
        if g.unsupported:
            self._reprobe(g, tier, values)
            if g.lost or not self._up:
                return GpuRead(g.identity, False)
        return GpuRead(g.identity, True, tuple(values))

    def _reprobe(self, g: _GpuState, tier: str, values: list[tuple[str, Mapping[str, float]]]) -> None:
        """Ask again the readers of `tier` whose re-probe time has come; one that answers is read again."""
        now = self._clock()
        for reader in self._readers:
            due = g.unsupported.get(reader.name)
            if due is None or reader.tier != tier or now < due:
                continue
            del g.unsupported[reader.name]
            g.choice.pop(reader.name, None)
            g.plans.clear()
            vals = self._recover_call(g, reader, None)
            if g.lost or not self._up:
                return
            if vals is not None:
                g.answered.add(reader.name)
                g.reprobe.pop(reader.name, None)
                log.info("nvml call available again", extra={
                    "gpu": g.identity.index, "reader": reader.name,
                    "call": reader.calls[g.choice.get(reader.name, 0)].symbol})
                values.append((reader.name, MappingProxyType(vals)))

    def _recover_call(self, g: _GpuState, reader: Reader, first: Exception | None) -> dict[str, float] | None:
        """The error policy for one failed reader (or a re-probe, `first` None): alternatives, lost GPU,
        driver gone, retry, and last "unsupported for now"."""
        idx = g.choice.get(reader.name, 0)
        retried = False
        error: Exception | None = first
        while idx < len(reader.calls):
            call = reader.calls[idx]
            if error is None:
                try:
                    vals = call.fn(g.handle)
                except Exception as e:  # noqa: BLE001
                    error = e
                else:
                    if g.choice.get(reader.name, 0) != idx:
                        g.choice[reader.name] = idx
                        g.plans.clear()
                        log.info("using fallback nvml call", extra={
                            "gpu": g.identity.index, "reader": reader.name, "call": call.symbol})
                    g.misses.pop(reader.name, None)
                    return dict(vals)
            e, error = error, None
            if not isinstance(e, pynvml.NVMLError):  # a broken binding must not take the GPU down
                self.errors_total[(g.identity.index, call.symbol, type(e).__name__)] += 1
                log.warning("nvml call raised", extra={"gpu": g.identity.index, "call": call.symbol,
                                                        "error": repr(e)})
                return None
            d = classify(e)
            if d in (Disposition.UNSUPPORTED, Disposition.MISSING_SYMBOL, Disposition.NO_PERMISSION):
                self._say_once(g, reader, call.symbol, d, e)
                idx += 1
                continue
            if d is Disposition.GPU_LOST:
                self._mark_lost(g, call.symbol)
                return None
            if d in (Disposition.DRIVER_MISMATCH, Disposition.NOT_INITIALISED):
                self._go_down(e)
                return None
            self.errors_total[(g.identity.index, call.symbol, error_name(e))] += 1
            if retried:  # transient (Unknown, Timeout…): one immediate retry, then the next cycle
                return None
            retried = True
        self._refused(g, reader)
        return None

    def _refused(self, g: _GpuState, reader: Reader) -> None:
        """Every call of `reader` said not supported / no permission / no such symbol, this time."""
        name = reader.name
        if name in g.answered:
            misses = g.misses.get(name, 0) + 1
            if misses < _MISSES_BEFORE_UNSUPPORTED:
                g.misses[name] = misses  # left out this cycle, asked again the next
                return
        g.misses.pop(name, None)
        if name not in g.reprobe:
            g.reprobe[name] = self._reprobe_backoff()
        g.unsupported[name] = self._clock() + g.reprobe[name].next_delay()
        g.choice.pop(name, None)
        g.plans.clear()

    def _reprobe_backoff(self) -> Backoff:
        """A refused reader's (or process listing's) schedule: 10 s doubling up to retry_max_s, no jitter."""
        return Backoff(_FIRST_REPROBE_S, self._retry_max_s, jitter=0.0)

    def _say_once(self, g: _GpuState, reader: Reader, symbol: str, d: Disposition, e: Exception) -> None:
        key = (reader.name, symbol, d)
        if key in self._said:
            return
        self._said.add(key)
        level = logging.WARNING if d is Disposition.NO_PERMISSION else logging.INFO
        log.log(level, "nvml call not available", extra={
            "gpu": g.identity.index, "reader": reader.name, "call": symbol, "error": error_name(e),
            "hint": HINTS.get(d, "skipped on this GPU; the value is left out, not exported as 0")})

    def _release(self, g: _GpuState) -> None:
        """Let every reader free what it holds for this GPU's handle (GPM samples); never raises."""
        if g.handle is None:
            return
        for reader in self._readers:
            if reader.release is not None:
                try:
                    reader.release(g.handle)
                except Exception as e:  # noqa: BLE001 - freeing must not take the session down
                    log.debug("reader release failed", extra={"reader": reader.name, "error": repr(e)})

    def _mark_lost(self, g: _GpuState, symbol: str) -> None:
        self._release(g)
        g.lost = True
        g.lost_retry.reset()
        g.next_retry = self._clock() + g.lost_retry.next_delay()
        g.plans.clear()
        log.error("gpu lost", extra={"gpu": g.identity.index, "uuid": g.identity.uuid, "call": symbol,
                                     "hint": "fell off the bus (XID 79?): needs a GPU reset or reboot"})

    def _recover(self, g: _GpuState) -> bool:
        now = self._clock()
        if now < g.next_retry:
            return False
        try:
            if g.verified:
                h = pynvml.nvmlDeviceGetHandleByUUID(g.identity.uuid)
                pynvml.nvmlDeviceGetUUID(h)
            else:  # lost since start: never read in this run, so found again by index and read afresh
                h = pynvml.nvmlDeviceGetHandleByIndex(g.identity.index)
                g.identity = self._identity(g.identity.index, h)
                g.verified = True
        except pynvml.NVMLError as e:
            if classify(e) in (Disposition.DRIVER_MISMATCH, Disposition.NOT_INITIALISED):
                self._go_down(e)
            g.next_retry = now + g.lost_retry.next_delay()
            return False
        g.handle, g.lost = h, False
        g.forget_support()
        g.lost_retry.reset()
        log.warning("gpu back", extra={"gpu": g.identity.index, "uuid": g.identity.uuid})
        return True

    # ----- actuation -----------------------------------------------------------------------------
    def set_power_limit(self, index: int, watts: float) -> float:
        """Set the power management limit and return what the driver reports back, in watts.

        Uses the v1 setter: nvidia-ml-py's nvmlDeviceSetPowerManagementLimit_v2 ignores the driver's
        return code. The read-back is the truth either way; a mismatch raises SetFailed("not_applied").
        """
        with self._lock:
            g = self._gpu(index)
            milliwatts = int(round(watts * 1000))
            try:
                pynvml.nvmlDeviceSetPowerManagementLimit(g.handle, milliwatts)
                back = pynvml.nvmlDeviceGetPowerManagementLimit(g.handle)
            except pynvml.NVMLError as e:
                d = classify(e)
                if d is Disposition.GPU_LOST:
                    self._mark_lost(g, "nvmlDeviceSetPowerManagementLimit")
                raise SetFailed(_SET_KIND.get(d, error_name(e)), str(e)) from None
            if abs(back - milliwatts) > 1000:
                raise SetFailed("not_applied", f"asked {milliwatts} mW, driver reports {back} mW")
            return back / 1000.0

    def _gpu(self, index: int) -> _GpuState:
        for g in self._gpus:
            if g.identity.index == index:
                if g.lost or not self._up:
                    raise SetFailed("gpu_lost", f"GPU {index} is not readable")
                return g
        raise SetFailed("no_such_gpu", f"no GPU {index}")

    # ----- MIG ---------------------------------------------------------------------------------
    @property
    def mig_identities(self) -> tuple[MigIdentity, ...]:
        """The MIG devices found at the last discovery, in GPU and slot order."""
        return tuple(ident for index in sorted(self._migs) for ident, _ in self._migs[index])

    def discover_mig(self) -> tuple[MigIdentity, ...]:
        """Enumerate MIG devices again (an operator may reconfigure MIG at any time); the slow tier calls it."""
        with self._lock:
            if self._up:
                self._discover_mig()
            return self.mig_identities

    def _discover_mig(self) -> None:
        found: dict[int, list[tuple[MigIdentity, Any]]] = {}
        for g in self._gpus:
            if g.lost:
                continue
            try:
                devices = miglib.discover(g.handle, g.identity.index, g.identity.uuid)
            except pynvml.NVMLError as e:
                self._fail(g, "nvmlDeviceGetMigDeviceHandleByIndex", e)
                continue
            if devices:
                found[g.identity.index] = devices
            before = {i.uuid for i, _ in self._migs.get(g.identity.index, ())}
            if before != {i.uuid for i, _ in devices}:
                log.info("mig devices", extra={"gpu": g.identity.index, "instances": len(devices),
                                               "profiles": ",".join(i.profile for i, _ in devices)})
        self._migs = found

    def read_mig(self) -> dict[str, tuple[float, float]]:
        """Memory (used, total) bytes per MIG UUID for readable instances of readable GPUs."""
        out: dict[str, tuple[float, float]] = {}
        with self._lock:
            for g, ident, handle in self._mig_handles():
                try:
                    out[ident.uuid] = miglib.read_memory(handle)
                except pynvml.NVMLError as e:
                    self._fail(g, "nvmlDeviceGetMemoryInfo", e)
        return out

    def read_mig_gpm(self) -> dict[str, Mapping[str, float]]:
        """GPM metrics per MIG UUID since the last call (nvmlGpmMigSampleGet on the parent, by GPU instance).

        An instance's first read only takes its first sample; a GPU without GPM is asked once per NVML
        initialisation and then left out.
        """
        out: dict[str, Mapping[str, float]] = {}
        # GPM samples a GPU instance; its compute instances (MIG devices with the same GPU instance id) share
        # that sample. Read each instance once per call: a second read would measure a near-zero interval.
        read: dict[tuple[int, int], Mapping[str, float] | None] = {}
        with self._lock:
            for g, ident, _ in self._mig_handles():
                if g.identity.index in self._gpm_mig_unsupported:
                    continue
                key = (g.identity.index, ident.gpu_instance)
                if key not in read:
                    read[key] = None
                    try:
                        values = self._gpm.read_mig(g.handle, ident.gpu_instance)
                    except pynvml.NVMLError as e:
                        if classify(e) in (Disposition.UNSUPPORTED, Disposition.MISSING_SYMBOL,
                                           Disposition.NO_PERMISSION):
                            self._gpm_mig_unsupported.add(g.identity.index)
                        else:
                            self._fail(g, "nvmlGpmMigSampleGet", e)
                        continue
                    read[key] = MappingProxyType(dict(values)) if values else None
                found = read[key]
                if found is not None:
                    out[ident.uuid] = found
        return out

    def mig_compute_pids(self) -> dict[str, tuple[int, ...]]:
        """Host PIDs of compute processes per MIG UUID (what runs in each instance)."""
        out: dict[str, tuple[int, ...]] = {}
        with self._lock:
            for g, ident, handle in self._mig_handles():
                try:
                    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                except pynvml.NVMLError as e:
                    self._fail(g, "nvmlDeviceGetComputeRunningProcesses", e)
                    continue
                out[ident.uuid] = tuple(sorted({int(p.pid) for p in procs}))
        return out

    def _mig_handles(self) -> Iterator[tuple[_GpuState, MigIdentity, Any]]:
        by_index = {g.identity.index: g for g in self._gpus}
        for index in sorted(self._migs):
            g = by_index.get(index)
            for ident, handle in self._migs[index]:
                if g is None or g.lost or not self._up:
                    break
                yield g, ident, handle

    def _fail(self, g: _GpuState, symbol: str, e: pynvml.NVMLError) -> None:
        """The error policy for a MIG call: a lost parent or a gone driver as anywhere, else counted."""
        d = classify(e)
        if d is Disposition.GPU_LOST:
            self._mark_lost(g, symbol)
            self._migs.pop(g.identity.index, None)
        elif d in (Disposition.DRIVER_MISMATCH, Disposition.NOT_INITIALISED):
            self._go_down(e)
        else:
            self.errors_total[(g.identity.index, symbol, error_name(e))] += 1

    # ----- other uses ----------------------------------------------------------------------------
    def compute_pids(self) -> dict[int, tuple[int, ...]]:
        """Host PIDs of compute processes per readable GPU (lost or failing GPUs are left out)."""
        out: dict[int, tuple[int, ...]] = {}
        with self._lock:
            for g in self._gpus:
                if g.lost or not self._up or self._clock() < g.processes_due:
                    continue
                try:
                    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(g.handle)
                except pynvml.NVMLError as e:
                    d = classify(e)
                    if d is Disposition.GPU_LOST:
                        self._mark_lost(g, "nvmlDeviceGetComputeRunningProcesses")
                    elif d in (Disposition.UNSUPPORTED, Disposition.MISSING_SYMBOL, Disposition.NO_PERMISSION):
                        # asked again after a back-off, like any reader: the refusal may be transient
                        if g.processes_retry is None:
                            g.processes_retry = self._reprobe_backoff()
                        g.processes_due = self._clock() + g.processes_retry.next_delay()
                    else:
                        self.errors_total[(g.identity.index, "nvmlDeviceGetComputeRunningProcesses",
                                           error_name(e))] += 1
                    continue
                g.processes_retry = None  # answered: a later refusal starts the back-off afresh
                out[g.identity.index] = tuple(sorted({int(p.pid) for p in procs}))
        return out

    def handles(self) -> dict[int, Any]:
        """Current handles of readable GPUs, for event registration."""
        with self._lock:
            return {g.identity.index: g.handle for g in self._gpus if not g.lost}

    def index_of_handle(self, handle: Any) -> int | None:
        """The GPU index an event's device handle belongs to."""
        addr = ctypes.cast(handle, ctypes.c_void_p).value
        for g in self._gpus:
            if ctypes.cast(g.handle, ctypes.c_void_p).value == addr:
                return g.identity.index
        return None
