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

log = logging.getLogger("gpumond.nvml.xid")


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
        self.healthy = False
        self.error: str | None = None

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
            self.healthy, self.error = False, "nvml_down"
        else:
            try:
                self._register()
                self.healthy, self.error = True, None
            except pynvml.NVMLError as e:
                self.healthy, self.error = False, error_name(e)
                log.warning("xid registration failed; retrying in the watcher thread", extra={"error": self.error})
        self._thread = threading.Thread(target=self._run, name="gpumond-xid", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (it wakes within one wait) and free the event set."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._set is not None:
            try:
                pynvml.nvmlEventSetFree(self._set)
            except pynvml.NVMLError:
                pass
            self._set = None

    def _register(self) -> None:
        if self._set is None:
            self._set = pynvml.nvmlEventSetCreate()
        for index, h in self._handles().items():
            address = ctypes.cast(h, ctypes.c_void_p).value
            if self._registered.get(index, -1) == address:
                continue  # a GPU that came back has a new handle: registered again
            try:
                supported = pynvml.nvmlDeviceGetSupportedEventTypes(h)
                if not supported & pynvml.nvmlEventTypeXidCriticalError:
                    log.info("xid events not supported", extra={"gpu": index})
                    self._registered[index] = address
                    continue
                pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, self._set)
                self._registered[index] = address
            except pynvml.NVMLError as e:
                log.warning("xid registration failed", extra={"gpu": index, "error": error_name(e)})

    def _run(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            if not self._ready():
                self.healthy, self.error = False, "nvml_down"
                self._set = None
                self._registered.clear()
                self._stop.wait(1.0)  # registers within a second of NVML coming up
                continue
            try:
                self._register()
                self.healthy, self.error = True, None
                backoff = 1.0
                while not self._stop.is_set() and self._ready():
                    self._wait_once()
                    self._register()  # GPUs found or back since: one dict lookup each when nothing changed
            except pynvml.NVMLError as e:
                self.healthy, self.error = False, error_name(e)
                log.warning("xid watcher failing", extra={"error": error_name(e), "retry_s": backoff})
            except Exception as e:  # the thread must outlive anything the binding throws
                self.healthy, self.error = False, repr(e)
                log.exception("xid watcher crashed; restarting")
            self._set = None
            self._registered.clear()
            self._stop.wait(backoff)
            backoff = min(backoff * 2, 60.0)

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
