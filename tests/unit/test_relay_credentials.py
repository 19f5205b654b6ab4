"""Which credential a relayed batch carries upstream: the rank's own token, else the relay's (docs/configuration.md,
relay.authorization and relay.basic_auth) — never both, and never the relay's in place of a rank's."""

from __future__ import annotations

import httpx

from gpumond.agent.relay.buffer import Buffer, Entry
from gpumond.agent.relay.stats import RelayStats
from gpumond.agent.relay.upstream import Sender
from gpumond.web.client import Access
from tests.fakes import FakeClock
from tests.unit.test_relay_held_file import columnar


def test_a_rank_token_passes_through_and_the_relay_token_goes_with_tokenless_ranks_only(tmp_path) -> None:
    node_token = tmp_path / "token"
    node_token.write_text("node-secret\n")
    seen: list[str | None] = []

    def service(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(400, json={"error": "seen"})  # refused: the round goes on to the next batch

    clock = FakeClock()
    buffer = Buffer(1 << 20, 600, clock)
    sender = Sender(buffer=buffer, stats=RelayStats(clock), upstream="http://rules:9481", shards=None,
                    access=Access(token_file=node_token), client=httpx.Client(transport=httpx.MockTransport(service)),
                    clock=clock)
    buffer.add(Entry(("own", "Bearer rank-secret"), ("own", 0), columnar("own"), 1, clock()))
    buffer.add(Entry(("none", None), ("none", 0), columnar("none"), 1, clock()))
    sender.flush()
    assert seen == ["Bearer rank-secret", "Bearer node-secret"]  # one batch each, in the order they arrived
