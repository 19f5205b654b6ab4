"""A forked child (a DataLoader worker) inherits the reporter but must neither record nor push."""

from __future__ import annotations

import json
import os
import threading

import pytest

from gpumond.job import Reporter
from gpumond.job.transport import Reply

GPU = "GPU-11111111-1111-1111-1111-111111111111"


class CountingTransport:
    """202 to everything; counts requests made in this process."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.lock = threading.Lock()

    def post(self, body: bytes, timeout_s: float, *, early: bool = False) -> Reply:
        with self.lock:
            self.steps += [s["step"] for s in json.loads(body)["steps"]]
        return Reply(202)

    def close(self) -> None:
        pass


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_is_a_no_op_and_the_parent_carries_on() -> None:
    transport = CountingTransport()
    rep = Reporter(job="j", gpu_uuid=GPU, transport=transport, push_interval_s=3600)  # pushes only when closed
    for _ in rep.wrap(range(3)):
        pass
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it saw through the pipe, then leave without pytest's cleanup
        try:
            inherited = rep.stats.queue_len
            for _ in rep.wrap(range(100)):
                rep.step_end(samples=1)
            with rep.step():
                pass
            rep.close(timeout_s=1)  # in the parent this would push the 3 queued steps
            seen = {"enabled": rep.enabled, "queue": len(rep._q), "posts": len(transport.steps),
                    "inherited": inherited}
            os.write(write_fd, json.dumps(seen).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        child = json.loads(pipe.read() or "{}")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child["enabled"] is False and child["queue"] == 0 and child["inherited"] == 0
    assert child["posts"] == 0
    # The parent is untouched by the child's close and keeps numbering its own steps.
    assert rep.enabled
    rep.step_end()
    rep.close(timeout_s=5)
    assert transport.steps == [0, 1, 2, 3]
