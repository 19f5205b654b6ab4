"""A rank's push at the relay: judged by the rules service's own checks (gpumond/push), completed by the agent
(gpumond/agent/relay/fill.py) and written as the columnar line it will be forwarded as."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpumond.agent.relay.buffer import Entry
from gpumond.agent.relay.fill import FillError, Filler
from gpumond.config.rules import LimitsConfig
from gpumond.push.body import PayloadError, columns_model, parse, push_model
from gpumond.push.encode import columns_body


@dataclass(frozen=True, slots=True)
class Refused:
    """The answer to a push the relay will not hold: the status and words the service would have used."""

    status: int
    message: str


class Intake:
    """Turns a push body into a buffer Entry, or a Refused."""

    def __init__(self, filler: Filler, clock: Callable[[], float], limits: LimitsConfig | None = None) -> None:
        # The service's default limits: a push the relay holds is one the service would take by default.
        limits = limits or LimitsConfig()
        self.max_body_bytes = limits.max_body_bytes
        self._json = push_model(limits.max_string_len, limits.max_steps_per_push, True)
        self._columns = columns_model(limits.max_string_len, limits.max_steps_per_push, True)
        self._filler = filler
        self._clock = clock

    def judge(self, body: bytes, *, columns: bool, authorization: str | None, pid: int | None,
              pid_start: int | None = None) -> Entry | Refused:
        """The push as a buffer entry (not yet held), or why not; `pid` and `pid_start`: the sender's, from its
        Gpumond-Pid and Gpumond-Pid-Start."""
        try:
            push = parse(self._columns if columns else self._json, body)
            who = self._filler.fill(job=push.job, node=push.node, gpu_uuid=push.gpu_uuid, pid=pid,
                                    pid_start=pid_start)
        except PayloadError as err:
            return Refused(err.status, err.message)
        except FillError as err:
            return Refused(422, str(err))
        steps = push.step_columns()
        head = {"job": who.job, "rank": push.rank, "world_size": push.world_size, "node": who.node,
                "gpu_uuid": who.gpu_uuid, "group": push.group, "incarnation": push.incarnation, "final": push.final}
        line = columns_body(head, steps)
        return Entry((who.job, authorization), (who.job, push.rank), line, len(steps), self._clock())
