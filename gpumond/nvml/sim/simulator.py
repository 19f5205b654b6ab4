"""SimulatedNvml: the GPUs of one node, the fault schedule, event sets, and installation
into pynvml. The ctypes surface is in `library.py`; this module is its state behind a lock.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from .clock import ManualClock, SimClock
from .events import Event, EventHub
from .gpu import XID_GPU_FELL_OFF_BUS, SimGpu
from .library import build_library
from .models import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_SINGLE_BIT_ECC,
    EVENT_XID,
    MAX_GPUS,
    MODELS,
)
from .scenario import (
    ERROR_CODES,
    INSTANT_KINDS,
    Fault,
    Scenario,
    ScenarioError,
    load_scenario,
    parse_fault,
)

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15

# An event wait re-checks the fault schedule this often (wall seconds), so a scenario XID
# whose time has come is delivered even when no other call advances the simulation.
EVENT_POLL_S = 0.02


@dataclass
class _ErrorFault:
    fault_id: int
    gpu: int | str | None  # None / "all": any call of the function
    code: int
    remaining: int | None  # None: until the fault ends


class SimulatedNvml:
    def __init__(self, gpu_count: int = 8, node: str = "gpu-node-01",
                 scenario: Scenario | str | Path | None = None,
                 clock: SimClock | ManualClock | None = None, seed: int = 0,
                 missing_functions: frozenset[str] | set[str] = frozenset(),
                 init_error: str | None = None, allow_set: bool = True, scenario_name: str | None = None) -> None:
        """`scenario_name` names the scenario in errors (its file's name; default: that, else "scenario")."""
        if not 0 <= gpu_count <= MAX_GPUS:
            raise ValueError(f"gpu_count must be between 0 and {MAX_GPUS}, got {gpu_count}")
        if isinstance(scenario, (str, Path)):
            scenario_name = scenario_name or Path(scenario).name
            scenario = load_scenario(scenario)
        name = scenario_name or "scenario"
        self.scenario = scenario if scenario is not None else Scenario()
        self.node = node
        self.seed = seed
        self.clock = clock if clock is not None else SimClock()
        self.allow_set = allow_set
        if init_error is not None and init_error not in ERROR_CODES:
            raise ValueError(f"unknown init_error {init_error!r}")
        self.init_error_code = ERROR_CODES[init_error] if init_error else NVML_SUCCESS

        # One lock for all model state; the condition lets event waits sleep on it.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._init_count = 0
        self._hub = EventHub()
        self._gpm_samples: dict[int, Any] = {}  # address of an allocated GPM sample → gpm.Sample
        self._schedule: list[tuple[float, int, str, int]] = []  # heap of (t, seq, start|end, id)
        self._faults: dict[int, Fault] = {}
        self._error_faults: dict[str, list[_ErrorFault]] = {}
        self._seq = itertools.count()
        self._next_t = math.inf
        self._installed_over: tuple[Any] | None = None

        entries = {}
        for i, entry in enumerate(self.scenario.gpus):
            if entry.index >= gpu_count:
                raise ScenarioError(f"{name}: gpus[{i}].index: GPU {entry.index} does not exist "
                                    f"(gpu_count={gpu_count})")
            entries[entry.index] = entry
        t0 = self.clock.now()
        self._gpus: list[SimGpu] = []
        for index in range(gpu_count):
            entry = entries.get(index)
            self._gpus.append(SimGpu(
                index=index, node=node, spec=MODELS[entry.model if entry else "h100-sxm"],
                base_load=(entry.load if entry and entry.load else self.scenario.default_load),
                inlet=self.scenario.inlet, inlet_offset_c=entry.inlet_offset_c if entry else 0.0,
                seed=seed, t0=t0))
            if entry is not None and entry.mig is not None:
                spec = self._gpus[-1].spec
                self._gpus[-1].enable_mig([spec.mig_profiles[name] for name in entry.mig])
        self._by_handle = {gpu.handle: gpu for gpu in self._gpus}
        self._mig_by_handle = {m.handle: m for gpu in self._gpus for m in gpu.mig}
        for i, fault in enumerate(self.scenario.faults):
            self._check_gpu(fault, f"{name}: faults[{i}].gpu")
            self._schedule_fault(fault, fault.at_s or 0.0)
        self.library = build_library(self, frozenset(missing_functions))

    # ---- public API -----------------------------------------------------------------
    @property
    def gpus(self) -> list[SimGpu]:
        """The GPUs, brought up to the current simulated time first."""
        self.sync()
        return list(self._gpus)

    def now(self) -> float:
        return self.clock.now()

    def sync(self) -> None:
        with self._lock:
            now = self.clock.now()
            self._process(now)
            for gpu in self._gpus:
                gpu.advance(now)

    def inject(self, fault: Fault | dict[str, Any]) -> None:
        """Apply a fault at runtime. `at_s`, if given, is a delay from now (simulated s)."""
        fault = parse_fault(fault)
        self._check_gpu(fault, "fault.gpu")
        with self._cond:
            now = self.clock.now()
            self._process(now)
            self._schedule_fault(fault, now + (fault.at_s or 0.0))
            self._process(now)

    def set_processes(self, gpu_index: int, pids: list[int]) -> None:
        if not 0 <= gpu_index < len(self._gpus):
            raise IndexError(f"no GPU {gpu_index} (gpu_count={len(self._gpus)})")
        with self._lock:
            self._gpus[gpu_index].processes = [int(pid) for pid in pids]

    def set_mig_processes(self, gpu_index: int, mig_index: int, pids: list[int]) -> None:
        """The host PIDs running on one MIG device of a MIG-enabled GPU."""
        if not 0 <= gpu_index < len(self._gpus):
            raise IndexError(f"no GPU {gpu_index} (gpu_count={len(self._gpus)})")
        migs = self._gpus[gpu_index].mig
        if not 0 <= mig_index < len(migs):
            raise IndexError(f"GPU {gpu_index} has no MIG device {mig_index} ({len(migs)} configured)")
        with self._lock:
            migs[mig_index].processes = [int(pid) for pid in pids]

    def gpu_for(self, handle: Any) -> SimGpu:
        """The SimGpu behind a pynvml device handle (tests compare event handles with it)."""
        import ctypes

        address = ctypes.cast(handle, ctypes.c_void_p).value if not isinstance(handle, int) else handle
        return self._by_handle[address]

    def install(self) -> SimulatedNvml:
        """Make pynvml use this simulated library. The one place that touches pynvml's module
        state: its library object, its symbol cache and its init refcount."""
        with pynvml.libLoadLock:
            if self._installed_over is None:
                self._installed_over = (pynvml.nvmlLib,)
            pynvml.nvmlLib = self.library
            pynvml._nvmlGetFunctionPointer_cache.clear()
            pynvml._nvmlLib_refcount = 0
        return self

    def uninstall(self) -> None:
        with pynvml.libLoadLock:
            if self._installed_over is None:
                return
            previous = self._installed_over[0]
            # Only restore if nobody installed something else over us meanwhile.
            if pynvml.nvmlLib is self.library:
                pynvml.nvmlLib = previous
                pynvml._nvmlGetFunctionPointer_cache.clear()
                pynvml._nvmlLib_refcount = 0
            self._installed_over = None

    def __enter__(self) -> SimulatedNvml:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    # ---- used by library.py (caller holds self._lock) ---------------------------------
    def _device_call(self, name: str, handle: int | None) -> tuple[int, SimGpu | None]:
        if not self._init_count:
            return NVML_ERROR_UNINITIALIZED, None
        gpu = self._by_handle.get(handle)  # type: ignore[arg-type]
        if gpu is None:
            return NVML_ERROR_INVALID_ARGUMENT, None
        now = self.clock.now()
        if now >= self._next_t:
            self._process(now)
        gpu.advance(now)
        gpu.device_calls += 1  # lets tests prove a lost GPU's handle is left alone
        if gpu.lost:
            return NVML_ERROR_GPU_IS_LOST, gpu
        if name in self._error_faults:
            code = self._take_error(name, gpu.index)
            if code:
                return code, gpu
        return NVML_SUCCESS, gpu

    def _mig_call(self, name: str, handle: int | None) -> tuple[int, Any]:
        """(code, SimMigDevice) for a call on a MIG handle; (0, None) when it is not one."""
        mig = self._mig_by_handle.get(handle)  # type: ignore[arg-type]
        if mig is None:
            return NVML_SUCCESS, None
        code, _ = self._device_call(name, mig.parent.handle)  # the parent's time, faults and loss apply
        return code, mig

    def _system_call(self, name: str, needs_init: bool = True) -> int:
        if needs_init and not self._init_count:
            return NVML_ERROR_UNINITIALIZED
        now = self.clock.now()
        if now >= self._next_t:
            self._process(now)
        if name in self._error_faults:
            return self._take_error(name, None)
        return NVML_SUCCESS

    def _wait_event(self, set_handle: int | None, timeout_ms: int) -> tuple[int, Event | None]:
        deadline = time.monotonic() + timeout_ms / 1000.0
        with self._cond:
            code = self._system_call("nvmlEventSetWait_v2")
            if code:
                return code, None
            event_set = self._hub.get(set_handle)
            if event_set is None:
                return NVML_ERROR_INVALID_ARGUMENT, None
            while True:
                self._process(self.clock.now())
                if event_set.queue:
                    return NVML_SUCCESS, event_set.queue.popleft()
                if self._hub.get(set_handle) is not event_set:
                    return NVML_ERROR_INVALID_ARGUMENT, None  # freed while we waited
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return NVML_ERROR_TIMEOUT, None
                self._cond.wait(min(remaining, EVENT_POLL_S))

    # ---- fault schedule ---------------------------------------------------------------
    def _check_gpu(self, fault: Fault, where: str) -> None:
        if isinstance(fault.gpu, int) and fault.gpu >= len(self._gpus):
            raise ScenarioError(f"{where}: GPU {fault.gpu} does not exist (gpu_count={len(self._gpus)})")
        if fault.kind.startswith("nvlink_"):
            link = fault.link or 0
            for gpu in self._targets(fault):
                if link >= gpu.spec.nvlink_links:
                    raise ScenarioError(f"{where}: GPU {gpu.index} ({gpu.model}) has no NVLink {link} "
                                        f"({gpu.spec.nvlink_links} links)")

    def _schedule_fault(self, fault: Fault, start: float) -> None:
        fault_id = next(self._seq)
        self._faults[fault_id] = fault
        heapq.heappush(self._schedule, (start, fault_id, "start", fault_id))
        if fault.duration_s is not None and fault.kind not in INSTANT_KINDS:
            heapq.heappush(self._schedule, (start + fault.duration_s, next(self._seq), "end", fault_id))
        self._next_t = self._schedule[0][0]

    def _targets(self, fault: Fault) -> list[SimGpu]:
        if fault.kind == "nvml_error":
            return []  # acts on calls, not on the model
        if fault.gpu is None or fault.gpu == "all":
            return self._gpus
        return [self._gpus[fault.gpu]]  # type: ignore[index]

    def _process(self, now: float) -> None:
        """Apply every scheduled transition due by `now`, in time order, each at its own time."""
        delivered = False
        while self._schedule and self._schedule[0][0] <= now:
            t, _, action, fault_id = heapq.heappop(self._schedule)
            fault = self._faults.get(fault_id)
            if fault is None:
                continue
            targets = self._targets(fault)
            for gpu in targets:
                gpu.advance(t)  # integrate up to the transition with the old parameters
            if action == "start":
                delivered |= self._start(fault_id, fault, targets)
            else:
                self._end(fault_id, fault, targets)
        self._next_t = self._schedule[0][0] if self._schedule else math.inf
        if delivered:
            self._cond.notify_all()

    def _start(self, fault_id: int, fault: Fault, targets: list[SimGpu]) -> bool:
        kind = fault.kind
        delivered = False
        if kind == "nvml_error":
            self._error_faults.setdefault(fault.function or "", []).append(
                _ErrorFault(fault_id, fault.gpu, fault.error_code(), fault.count))
            return False
        for gpu in targets:
            if kind == "xid":
                for _ in range(fault.count or 1):
                    gpu.record_xid(fault.code or 0)
                    delivered |= self._hub.deliver(Event(gpu.index, EVENT_XID, fault.code or 0))
            elif kind in ("ecc_corrected", "ecc_uncorrected"):
                which = "corrected" if kind == "ecc_corrected" else "uncorrected"
                gpu.add_ecc(which, fault.count or 1)
                event_type = EVENT_SINGLE_BIT_ECC if which == "corrected" else EVENT_DOUBLE_BIT_ECC
                delivered |= self._hub.deliver(Event(gpu.index, event_type, 0))
            elif kind == "pcie_replay":
                gpu.pcie_replay += fault.count or 1
            else:
                if kind == "lost" and not gpu.lost:
                    # The driver logs XID 79 ("GPU has fallen off the bus") as it loses the GPU.
                    gpu.record_xid(XID_GPU_FELL_OFF_BUS)
                    delivered |= self._hub.deliver(Event(gpu.index, EVENT_XID, XID_GPU_FELL_OFF_BUS))
                gpu.start_fault(fault_id, fault)
        if kind in INSTANT_KINDS:
            del self._faults[fault_id]
        return delivered

    def _end(self, fault_id: int, fault: Fault, targets: list[SimGpu]) -> None:
        if fault.kind == "nvml_error":
            self._drop_error_fault(fault.function or "", fault_id)
        for gpu in targets:
            gpu.end_fault(fault_id)
        del self._faults[fault_id]

    def _take_error(self, name: str, gpu_index: int | None) -> int:
        for entry in self._error_faults.get(name, ()):
            if entry.gpu is None or entry.gpu == "all" or entry.gpu == gpu_index:
                if entry.remaining is not None:
                    entry.remaining -= 1
                    if entry.remaining <= 0:
                        self._drop_error_fault(name, entry.fault_id)
                return entry.code
        return NVML_SUCCESS

    def _drop_error_fault(self, name: str, fault_id: int) -> None:
        entries = [e for e in self._error_faults.get(name, ()) if e.fault_id != fault_id]
        if entries:
            self._error_faults[name] = entries
        else:
            self._error_faults.pop(name, None)
