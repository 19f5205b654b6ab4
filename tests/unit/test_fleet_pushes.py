"""fleet_scale's model of what ranks send (benchmarks/_fleet_pushes.py): the SDK's cadence, early pushes, the relay's
rounds and a silent straggler's steps."""

from __future__ import annotations

import json

import numpy as np

from benchmarks import _fleet_pushes as fp

START = 1_000.0


def _sdk_pushes(episodes: tuple[fp.Episode, ...], until: float, rank: int = 0, phase: float = 1.3) -> list[float]:
    """When a rank's SDK pushed, stepping every 0.5 s from START (with `episodes`) until `until`."""
    steps = fp.JobSteps(START, 0.5, episodes)
    sdk = fp.RankSdk("head", START + phase)
    got = []
    for t in np.arange(START + 1, until + 1e-9, 1.0):
        ended = steps.until(t)
        recs = fp.records(rank, "base", ended, 0.5, [(1.0, 1.0, 1.0)] * len(ended))
        got += [at for at, _, _ in sdk.advance(recs, t)]
    return got


def test_a_steady_rank_pushes_every_interval_at_its_phase():
    assert _sdk_pushes((), START + 30) == [START + 1.3 + 5 * k for k in range(6)]


def test_a_slowdown_makes_every_rank_push_early_at_most_once_a_second_keeping_the_phase():
    slow = (fp.Episode(rank=7, onset=START + 20, duration=60.0, slowdown=1.25),)
    pushes = _sdk_pushes(slow, START + 70)

    def on_phase(at: float) -> bool:
        return abs((at - START - 1.3) / 5 - round((at - START - 1.3) / 5)) < 1e-9

    early = [at for at in pushes if not on_phase(at)]
    assert early, "a step 1.25× long stands out: the SDK pushes at once"
    assert all(b - a >= 1.0 for a, b in zip(early, early[1:]))
    assert min(early) >= START + 20
    # The regular cadence keeps its phase: before, and once the rank's recent steps are the slow ones (no longer
    # standing out: ~25 s of early pushes), after.
    assert [at for at in pushes if on_phase(at)][:4] == [START + 1.3 + 5 * k for k in range(4)]
    assert max(early) < START + 50 and [at for at in pushes if at > START + 50] == [START + 1.3 + 5 * k
                                                                                  for k in range(10, 14)]


def test_the_straggler_waits_least_and_its_peers_wait_the_episodes_extra():
    steps = fp.JobSteps(START, 0.5, (fp.Episode(rank=3, onset=START, duration=10.0, slowdown=1.25),)).until(START + 2)
    assert [s.length for s in steps] == [0.625] * 3
    ones = [(1.0, 1.0, 1.0)] * 3
    straggler = fp.records(3, "base", steps, 0.5, ones)
    peer = fp.records(4, "base", steps, 0.5, ones)
    assert all(r[5] == fp.KINDS["slow"][1] for r in straggler)
    assert all(abs(r[5] - (fp.KINDS["base"][1] + 0.125)) < 1e-12 for r in peer)
    assert all(r[2] == 0.625 for r in straggler + peer)  # every rank ends the step together


def _body(rank: int, step: int) -> bytes:
    from gpumond.job.payload import encode_columns, encode_head

    head = encode_head({"job": "job", "rank": rank, "world_size": 8, "node": "n", "gpu_uuid": f"GPU-{rank}"},
                       "columns")
    return encode_columns(head, [(step, START + step, 0.5, 0.01, 32, 0.1)], 0.0, 0.0)


def test_a_relay_forwards_every_interval_what_its_ranks_pushed_before_the_round():
    relay = fp.NodeRelay("job", START + 0.5)
    body = _body
    assert relay.advance([(START + 0.2, body(0, 1), 1)], START + 0.4) == []  # before its round: held
    out = relay.advance([(START + 0.45, body(1, 1), 1), (START + 0.9, body(2, 1), 1)], START + 1.0)
    assert [steps for _, steps in out] == [2]  # the round at 0.5 s: the two pushes before it
    assert json.loads(out[0][0])["pushes"]["rank"] == [0, 1]
    out = relay.advance([], START + 3.0)
    assert [steps for _, steps in out] == [1]  # the round at 2.5 s: the one after the first round


def test_a_relay_with_a_longer_interval_holds_its_ranks_pushes_until_its_next_round():
    relay = fp.NodeRelay("job", START + 0.5, interval_s=5.0)
    assert [steps for _, steps in relay.advance([(START + 0.2, _body(0, 1), 1)], START + 1.0)] == [1]  # at 0.5 s
    # the next round is at 5.5 s, not 2.5 s
    assert relay.advance([(START + 0.6, _body(1, 1), 1)], START + 5.4) == []
    assert [steps for _, steps in relay.advance([], START + 5.5)] == [1]


def test_a_relay_forwards_an_early_push_at_once_at_most_once_a_second():
    relay = fp.NodeRelay("job", START + 0.5)
    relay.advance([], START + 0.5)  # its first regular round: nothing held
    out = relay.advance([(START + 0.6, _body(0, 1), 1, False), (START + 0.8, _body(1, 1), 1, True)], START + 1.0)
    # 50 ms after the early push (not at the next round, 2.5 s): it and the push held before it
    assert [steps for _, steps in out] == [2] and json.loads(out[0][0])["pushes"]["rank"] == [0, 1]
    # Another early push within the second after that round waits for the second to pass (1.85 s)
    assert relay.advance([(START + 1.2, _body(2, 1), 1, True)], START + 1.8) == []
    assert [steps for _, steps in relay.advance([], START + 1.9)] == [1]


def test_senders_send_every_step_once_directly_or_through_relays():
    ranks = [[fp.Rank("big-job", n * 8 + g, 16, f"node-{n:05d}", f"GPU-{n}-{g}", "base") for g in range(8)]
             for n in range(2)]
    counted = {}
    for via in ("direct", "relay"):
        senders = fp.Senders(ranks, via, START, 0.5, ())
        counted[via] = sum(k for t in range(1, 31) for _, k in senders.tick(START + t, np.random.default_rng(t)))
    # 16 ranks × 60 steps by 30 s; pushed by then: every step up to each rank's (or relay's) last round.
    assert 16 * 50 <= counted["direct"] <= 16 * 60 and 16 * 50 <= counted["relay"] <= 16 * 60


def test_fleet_scale_refuses_settings_its_harness_cannot_keep():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "fleet_scale.py"
    for flag, value, says in (("--evaluation-interval-s", "2.5", "whole multiple"),
                              ("--relay-interval-s", "0", "above 0"), ("--max-busy", "1.5", "at most 1")):
        r = subprocess.run([sys.executable, str(script), "--quick", flag, value], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2 and says in r.stderr, (flag, r.stderr)
