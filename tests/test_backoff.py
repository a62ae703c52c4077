"""The brain-reconnect backoff schedule: 250 ms, 500 ms, 1 s, 2 s, then every 5 s."""

from __future__ import annotations

import pytest

from rutster.base.backoff import TAP_RECONNECT_DELAYS_S, Backoff

#: The schedule TAP_PROTOCOL.md ("Lost brain connection") promises brain authors.
DOCUMENTED_SCHEDULE_S = [0.25, 0.5, 1.0, 2.0, 5.0]


def test_default_schedule_matches_the_protocol_doc() -> None:
    assert list(TAP_RECONNECT_DELAYS_S) == DOCUMENTED_SCHEDULE_S
    backoff = Backoff()
    assert [backoff.next_delay() for _ in range(5)] == DOCUMENTED_SCHEDULE_S


def test_last_delay_repeats_forever() -> None:
    backoff = Backoff()
    delays = [backoff.next_delay() for _ in range(50)]
    assert delays[4:] == [5.0] * 46
    assert max(delays) == 5.0


def test_attempt_counts_failures() -> None:
    backoff = Backoff()
    assert backoff.attempt == 0
    for expected in range(1, 8):
        backoff.next_delay()
        assert backoff.attempt == expected


def test_reset_starts_the_schedule_over() -> None:
    backoff = Backoff()
    for _ in range(7):
        backoff.next_delay()
    backoff.reset()
    assert backoff.attempt == 0
    assert [backoff.next_delay() for _ in range(3)] == [0.25, 0.5, 1.0]
    # A reset mid-schedule (a connection that succeeded, then dropped again).
    backoff.reset()
    assert backoff.next_delay() == 0.25


def test_custom_schedule() -> None:
    backoff = Backoff([0.01, 0.02])
    assert [backoff.next_delay() for _ in range(4)] == [0.01, 0.02, 0.02, 0.02]


def test_empty_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one delay"):
        Backoff([])


def test_instances_are_independent() -> None:
    # Each call's TapClient owns its Backoff: one flapping brain must not slow another.
    first, second = Backoff(), Backoff()
    for _ in range(4):
        first.next_delay()
    assert second.next_delay() == 0.25
    assert first.next_delay() == 5.0
