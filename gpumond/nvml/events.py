"""XID events: a thread blocked in nvmlEventSetWait, counting critical errors by GPU and XID code."""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pynvml

from gpumond.nvml.errors import Disposition, classify, error_name
from gpumond.wire.retry import Backoff

log = logging.getLogger("gpumond.nvml.xid")

# A GPU whose event registration fails is asked again after 10 s, then 20, 40, 60, 60… s: a refusal may be
# transient (a driver busy resetting), and retrying after every wait would be two NVML calls and a line a
# second for the rest of the run.
_FIRST_REGISTER_RETRY_S = 10.0
REGISTER_RETRY_MAX_S = 60.0
# The watcher itself (its event set failing) restarts after 1 s, doubling up to this.
RESTART_MAX_S = 60.0


class XidWatcher:
    """Counts XIDs per (gpu, code); a counter, never a last-value gauge, so no event is hidden by the next."""

    def __init__(
        self,
        handles: Callable[[], dict[int, Any]],
        index_of_handle: Callable[[Any], int | None],
        *,
        wait_ms: int = 500,
        on_xid: Callable[[int, int], None] | None = None,
        ready: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.monotonic,
        pause: Callable[[float], object] | None = None,
    ) -> None:
        self._handles = handles
        self._ready = ready  # NVML is initialised: the watcher waits for it, then registers
        self._index_of = index_of_handle
        self._wait_ms = wait_ms
        self._on_xid = on_xid
        self._lock = threading.Lock()
        self._counts: Counter[tuple[int, int]] = Counter()
        self._last: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._set: Any = None
        self._registered: dict[int, int | None] = {}  # gpu index → address of the handle registered
        self._clock = clock
        # How the thread waits out a restart back-off: until stop() or that many seconds (injected by tests).
        self._pause = pause if pause is not None else self._stop.wait
        # gpu index → (address of the handle refused, when to ask again, its back-off, NVML error)
        self._failed: dict[int, tuple[int | None, float, Backoff, str]] = {}
        self._warned: set[int] = set()  # GPUs whose failure was logged, until they register
        self._running = False  # the event set works (False while NVML is down or the watcher restarts)
        self._why: str | None = None

    @property
    def healthy(self) -> bool:
        """True while the watcher runs and every readable GPU is registered (xid collector success)."""
        return self._running and not self._failed

    @property
    def error(self) -> str | None:
        """Why the watcher is not healthy, naming GPUs that get no XID events; None when healthy."""
        if not self._running:
            return self._why
        with self._lock:  # the watcher thread changes it
            failed = dict(self._failed)
        if not failed:
            return None
        return "xid registration failed on " + ", ".join(
            f"gpu {index} ({why})" for index, (_, _, _, why) in sorted(failed.items()))

    def counts(self) -> dict[tuple[int, int], int]:
        """A copy of the (gpu index, xid) → count table."""
        with self._lock:
            return dict(self._counts)

    def last(self) -> dict[int, int]:
        """gpu index → the most recent XID code (what dcgm-exporter's DCGM_FI_DEV_XID_ERRORS gauge shows)."""
        with self._lock:
            return dict(self._last)

    def start(self) -> None:
        """Register GPUs now (so the first scrape already knows the watcher's health), then wait in a thread.

        Safe to call while NVML is down: the thread registers within a second of NVML coming up.
        """
        if not self._ready():
            self._running, self._why = False, "nvml_down"
        else:
            try:
                self._register()
                self._running, self._why = True, None
            except pynvml.NVMLError as e:
                self._running, self._why = False, error_name(e)
                log.warning("xid registration failed; retrying in the watcher thread", extra={"error": self._why})
        self._thread = threading.Thread(target=self._run, name="gpumond-xid", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (it wakes within one wait) and free the event set."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._running, self._why = False, "stopped"
        if self._set is not None:
            try:
                pynvml.nvmlEventSetFree(self._set)
            except pynvml.NVMLError:
                pass
            self._set = None

    def _register(self) -> None:
        if self._set is None:
            self._set = pynvml.nvmlEventSetCreate()
        handles = self._handles()
        with self._lock:  # a lost GPU is gpu_up 0, not a registration failure
            for index in [i for i in self._failed if i not in handles]:
                del self._failed[index]
        now = self._clock()
        for index, h in handles.items():
            address = ctypes.cast(h, ctypes.c_void_p).value
            if self._registered.get(index, -1) == address:
                continue  # a GPU that came back has a new handle: registered again
            failed = self._failed.get(index)
            if failed is not None and failed[0] == address and now < failed[1]:
                continue  # refused before: asked again after its back-off, not after every wait
            try:
                supported = pynvml.nvmlDeviceGetSupportedEventTypes(h)
                if not supported & pynvml.nvmlEventTypeXidCriticalError:
                    log.info("xid events not supported", extra={"gpu": index})
                    self._registered[index] = address
                    continue
                pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, self._set)
            except pynvml.NVMLError as e:
                d = classify(e)
                if d in (Disposition.DRIVER_MISMATCH, Disposition.NOT_INITIALISED):
                    raise  # NVML itself is gone: the watcher restarts, not this GPU
                if d is Disposition.GPU_LOST:
                    continue  # the session marks it lost (gpu_up 0) and it is registered when it is back
                retry = failed[2] if failed is not None and failed[0] == address else \
                    Backoff(_FIRST_REGISTER_RETRY_S, REGISTER_RETRY_MAX_S, jitter=0.0)  # a new handle starts afresh
                delay = retry.next_delay()
                with self._lock:
                    self._failed[index] = (address, now + delay, retry, error_name(e))
                if index not in self._warned:  # said once; the xid collector stays failed meanwhile
                    self._warned.add(index)
                    log.warning("xid registration failed; this GPU gets no xid events until it registers",
                                extra={"gpu": index, "error": error_name(e), "retry_s": delay})
                continue
            self._registered[index] = address
            with self._lock:
                self._failed.pop(index, None)
            if index in self._warned:
                self._warned.discard(index)
                log.info("xid events registered", extra={"gpu": index})

    def _run(self) -> None:
        restart = Backoff(1.0, RESTART_MAX_S, jitter=0.0)
        while not self._stop.is_set():
            if not self._ready():
                self._running, self._why = False, "nvml_down"
                self._set = None
                self._registered.clear()
                with self._lock:
                    self._failed.clear()
                self._stop.wait(1.0)  # registers within a second of NVML coming up
                continue
            try:
                self._register()
                self._running, self._why = True, None
                restart.reset()
                while not self._stop.is_set() and self._ready():
                    self._wait_once()
                    self._register()  # GPUs found or back since: one dict lookup each when nothing changed
            except pynvml.NVMLError as e:
                self._running, self._why = False, error_name(e)
                delay = restart.next_delay()
                log.warning("xid watcher failing", extra={"error": error_name(e), "retry_s": delay})
            except Exception as e:  # the thread must outlive anything the binding throws
                self._running, self._why = False, repr(e)
                log.exception("xid watcher crashed; restarting")
                delay = restart.next_delay()
            else:
                delay = restart.next_delay()  # NVML went down under the wait loop (or the watcher is stopping)
            self._set = None
            self._registered.clear()
            with self._lock:
                self._failed.clear()  # a new event set: every GPU is registered afresh
            self._pause(delay)
        self._running, self._why = False, "stopped"

    def _wait_once(self) -> None:
        try:
            data = pynvml.nvmlEventSetWait_v2(self._set, self._wait_ms)
        except pynvml.NVMLError_Timeout:
            return
        except pynvml.NVMLError as e:
            if classify(e) is Disposition.GPU_LOST:
                time.sleep(self._wait_ms / 1000)  # a lost GPU's event source may keep failing; do not spin
                return
            raise
        if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
            return
        index = self._index_of(data.device)
        if index is None:
            return
        xid = int(data.eventData)
        with self._lock:
            self._counts[(index, xid)] += 1
            self._last[index] = xid
        log.warning("xid", extra={"gpu": index, "xid": xid})
        if self._on_xid is not None:
            self._on_xid(index, xid)
