"""The relay's buffer: bounded by bytes and by age, oldest first, in order per key, drops returned for counting."""

from __future__ import annotations

from gpumond.agent.relay.buffer import ENTRY_OVERHEAD, Buffer, Entry
from tests.fakes import FakeClock

ONE = 100 + len("j") + ENTRY_OVERHEAD  # what entry() costs the buffer with its defaults


def entry(clock: FakeClock, job: str = "j", rank: int = 0, size: int = 100, steps: int = 2) -> Entry:
    return Entry((job, None), (job, rank), b"x" * size, steps, clock())


def test_over_the_byte_bound_the_oldest_go_first_whatever_their_job() -> None:
    clock = FakeClock()
    buf = Buffer(max_bytes=3 * ONE, max_age_s=600, clock=clock)
    first, second, third = entry(clock, "a"), entry(clock, "b"), entry(clock, "a", rank=1)
    assert buf.add(first) == [] and buf.add(second) == [] and buf.add(third) == []
    fourth = entry(clock, "b", rank=1)
    assert buf.add(fourth) == [first]
    assert (buf.bytes, buf.count) == (3 * ONE, 3)
    assert buf.take(("a", None), 10_000) == [third] and buf.take(("b", None), 10_000) == [second, fourth]


def test_what_waited_longer_than_the_age_bound_is_dropped() -> None:
    clock = FakeClock()
    buf = Buffer(max_bytes=10_000, max_age_s=60, clock=clock)
    old = entry(clock)
    clock.advance(30)
    young = entry(clock)
    buf.add(old), buf.add(young)
    clock.advance(31)
    assert buf.oldest_age() == 61
    assert buf.expire() == [old]
    assert buf.oldest_age() == 31 and buf.count == 1


def test_take_keeps_order_and_the_byte_bound_and_done_releases() -> None:
    clock = FakeClock()
    buf = Buffer(max_bytes=10_000, max_age_s=600, clock=clock)
    entries = [entry(clock, size=100) for _ in range(5)]
    for e in entries:
        buf.add(e)
    taken = buf.take(("j", None), 250)
    assert taken == entries[:2]  # 2 × (100 + newline) fit in 250, a third does not
    buf.done(taken)
    assert buf.take(("j", None), 10_000) == entries[2:] and buf.bytes == 3 * ONE
    assert buf.take(("j", None), 1) == entries[2:3]  # at least one, whatever its size


def test_what_a_send_has_in_hand_is_never_dropped_the_oldest_idle_push_goes_instead() -> None:
    clock = FakeClock()
    buf = Buffer(max_bytes=3 * ONE, max_age_s=600, clock=clock)
    a, b, c = entry(clock, "x"), entry(clock, "y"), entry(clock, "y", rank=1)
    buf.add(a), buf.add(b), buf.add(c)
    in_flight = buf.take(("x", None), 10_000)
    assert in_flight == [a] and buf.add(entry(clock, "y", rank=2)) == [b]  # not a, though older
    buf.done(in_flight)
    assert (buf.count, buf.bytes) == (2, 2 * ONE)


def test_when_only_pushes_in_hand_fill_the_buffer_the_new_push_is_the_one_refused() -> None:
    clock = FakeClock()
    buf = Buffer(max_bytes=2 * ONE, max_age_s=600, clock=clock)
    a, b = entry(clock), entry(clock)
    buf.add(a), buf.add(b)
    in_flight = buf.take(("j", None), 10_000)
    new = entry(clock)
    assert buf.add(new) == [new] and (buf.count, buf.bytes) == (2, 2 * ONE)  # nothing held was dropped
    buf.release(in_flight)  # the send got no answer: they stay held, and may be dropped for room again
    assert buf.add(new) == [a] and buf.held() == [b, new]


def test_expiry_leaves_what_a_send_has_in_hand() -> None:
    clock = FakeClock()
    buf = Buffer(max_bytes=10_000, max_age_s=60, clock=clock)
    a, b = entry(clock, "x"), entry(clock, "y")
    buf.add(a), buf.add(b)
    buf.take(("x", None), 10_000)
    clock.advance(61)
    assert buf.expire() == [b] and buf.held() == [a]


def test_the_byte_bound_counts_what_an_entry_costs_not_only_its_line() -> None:
    """A client on the node sending tiny pushes with a long Authorization header: the buffer holds them within
    relay.buffer_max_bytes of the agent's memory (counting the lines alone it held ~80 times that)."""
    clock = FakeClock()
    buf = Buffer(max_bytes=64 * 1024, max_age_s=600, clock=clock)
    for rank in range(1_000):
        buf.add(Entry(("j", "Bearer " + "t" * 8_000), ("j", rank), b"{}", 1, clock()))
    assert buf.bytes <= 64 * 1024 and buf.count == 64 * 1024 // (2 + 8_007 + 1 + ENTRY_OVERHEAD)
