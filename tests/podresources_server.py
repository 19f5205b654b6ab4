"""A local kubelet stand-in: a real gRPC server on a unix socket speaking the pod-resources v1 proto.

    with PodResourcesServer(tmp_path / "kubelet.sock") as kubelet:
        kubelet.pods = [pod("ml", "trainer-0", ("main", "nvidia.com/gpu", ["GPU-…"]))]
        kubelet.hold.clear()      # calls now block until kubelet.hold.set() (a slow kubelet)
        kubelet.garbage = True    # answers bytes that are not a ListPodResourcesResponse

Used by the agent's pod-attribution tests and the attribution benchmark.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from gpumond.agent.podresources.v1 import api_pb2

# A bound on how long a held call may block the server thread, so a test that forgets to release it ends.
HOLD_LIMIT_S = 30.0


def pod(namespace: str, name: str, *containers: tuple[str, str, Sequence[str]]) -> Any:
    """A PodResources message: containers as (name, resource name, device ids)."""
    return api_pb2.PodResources(
        namespace=namespace, name=name,
        containers=[api_pb2.ContainerResources(
            name=cname, devices=[api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))])
            for cname, resource, ids in containers])


class PodResourcesServer:
    """Serves `v1.PodResourcesLister/List` from `pods` on a unix socket until closed."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = Path(socket_path)
        self.pods: list[Any] = []
        self.garbage = False
        self.hold = threading.Event()
        self.hold.set()  # set: answer at once
        self.calls = 0
        self._server: grpc.Server | None = None

    def _list(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.calls += 1
        self.hold.wait(HOLD_LIMIT_S)
        if self.garbage:
            return b"\xff\xff\xff\xff not a protobuf message"
        return api_pb2.ListPodResourcesResponse(pod_resources=self.pods).SerializeToString()

    def __enter__(self) -> PodResourcesServer:
        # A raw-bytes handler, so the same server can also answer garbage the client must survive.
        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(self._list)})
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=(handler,))
        self._server.add_insecure_port(f"unix://{self.socket_path}")
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.hold.set()
        if self._server is not None:
            self._server.stop(grace=None).wait(5.0)
            self._server = None
