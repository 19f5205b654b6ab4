"""The kubelet pod-resources client: polls `v1.PodResourcesLister/List` on its own thread.

Sampling never waits on the kubelet: the slow tier only reads the last good answer (`snapshot()`),
which is dropped once older than `max_age_s`, so a slow, absent or broken socket costs attribution
nothing but the fallback to process-based attribution. Each call has a deadline and a bounded
response size; failures back off up to `max_backoff_s`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumond.agent.podresources.assign import Allocation, allocations
from gpumond.wire.retry import Backoff
from gpumond.wire.safetext import one_line

log = logging.getLogger("gpumond.agent")

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
# dcgm-exporter allows 16 MiB too: a node with hundreds of pods and their CPU / memory lists stays far below.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_ALLOCATIONS = 65536  # device ids kept from one answer: a node has tens of GPUs, not thousands


@dataclass(frozen=True, slots=True)
class PodSnapshot:
    """One good List answer: when it came (clock seconds) and the device allocations in it."""

    taken_at: float
    allocations: tuple[Allocation, ...]


def load_grpc() -> tuple[Any, Any, Any] | str:
    """(grpc, api_pb2, api_pb2_grpc), or one line saying why they cannot be imported."""
    try:
        import grpc

        from gpumond.agent.podresources.v1 import api_pb2, api_pb2_grpc
    except Exception as e:  # ImportError, or the generated code refusing an old protobuf / grpcio
        return (f"{type(e).__name__}: {e}".splitlines()[0]
                + " (install the Kubernetes extra: pip install 'gpumond[k8s]')")
    return grpc, api_pb2, api_pb2_grpc


class PodResourcesClient:
    """Keeps the newest pod-resources answer; `start()` polls on a daemon thread until `stop()`."""

    def __init__(self, socket_path: Path = DEFAULT_SOCKET, *, timeout_s: float = 2.0, interval_s: float = 10.0,
                 max_age_s: float | None = None, max_backoff_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic,
                 grpc_modules: tuple[Any, Any, Any] | None = None) -> None:
        if timeout_s <= 0 or interval_s <= 0:
            raise ValueError("timeout_s and interval_s must be positive")
        self.socket_path = Path(socket_path)
        self._timeout_s = timeout_s
        self._interval_s = interval_s
        # Three missed polls: a kubelet restart fits, a pod deleted long ago does not linger.
        self._max_age_s = max_age_s if max_age_s is not None else 3 * interval_s + timeout_s
        # Failures in a row wait interval_s, doubling up to max_backoff_s (the node's own kubelet: no jitter).
        self._backoff = Backoff(interval_s, max(max_backoff_s, interval_s), jitter=0.0)
        self._clock = clock
        self._modules = grpc_modules
        self._channel: Any = None
        self._stub: Any = None
        self._lock = threading.Lock()
        self._snapshot: PodSnapshot | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None  # why the last poll failed (None after a good one)
        self.polls = 0
        self.failures = 0
        self.next_poll_s = interval_s  # the wait after the last poll: interval_s, or the back-off after a failure

    # ----- reading (the sampler's side: never blocks on the kubelet) -----------------------------
    def snapshot(self) -> PodSnapshot | None:
        """The last good answer, or None if there is none younger than max_age_s."""
        with self._lock:
            snap = self._snapshot
        if snap is None or self._clock() - snap.taken_at > self._max_age_s:
            return None
        return snap

    # ----- polling ---------------------------------------------------------------------------------
    def poll(self) -> bool:
        """One List call (bounded by timeout_s); True if it produced a fresh snapshot."""
        self.polls += 1
        try:
            snap = PodSnapshot(self._clock(), allocations(self._list().pod_resources, MAX_ALLOCATIONS))
        except Exception as e:  # noqa: BLE001 - grpc.RpcError, a decode error on garbage, anything
            self.failures += 1
            self.next_poll_s = self._backoff.next_delay()
            self._reset_channel()  # reconnect next time instead of waiting out grpc's own backoff
            reason = _one_line(e)
            if reason != self.error:
                log.warning("pod-resources unavailable: falling back to process attribution",
                            extra={"socket": str(self.socket_path), "error": reason})
            self.error = reason
            return False
        with self._lock:
            self._snapshot = snap
        if self.error is not None or self.polls == 1:
            log.info("pod-resources answering", extra={"socket": str(self.socket_path),
                                                       "device_ids": len(snap.allocations)})
        self.error = None
        self._backoff.reset()
        self.next_poll_s = self._interval_s
        return True

    def _list(self) -> Any:
        if self._modules is None:
            loaded = load_grpc()
            if isinstance(loaded, str):
                raise RuntimeError(loaded)
            self._modules = loaded
        grpc, api_pb2, api_pb2_grpc = self._modules
        if self._stub is None:
            self._channel = grpc.insecure_channel(
                f"unix://{self.socket_path}",
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.enable_retries", 0)])
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        return self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=self._timeout_s)

    def _reset_channel(self) -> None:
        if self._channel is not None:
            try:
                self._channel.close()
            except Exception:  # noqa: BLE001 - closing a broken channel may itself fail
                pass
        self._channel = self._stub = None

    def start(self) -> None:
        """Poll now and then every interval_s on a daemon thread."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpumond-pod-resources", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the polling thread (waits at most one call's deadline) and close the channel."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._timeout_s + 1.0)
            self._thread = None
        self._reset_channel()

    def _run(self) -> None:
        wait = 0.0
        while not self._stop.wait(wait):
            self.poll()
            wait = self.next_poll_s


def _one_line(e: BaseException) -> str:
    details = getattr(e, "details", None)
    code = getattr(e, "code", None)
    if callable(details) and callable(code):  # grpc.RpcError: "UNAVAILABLE: failed to connect …"
        try:
            return one_line(f"{code().name}: {details()}".splitlines()[0])
        except Exception:  # noqa: BLE001
            pass
    return one_line(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
