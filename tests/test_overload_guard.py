"""The overload guard's decisions, driven with samples in virtual time (no loop, no clock)."""

from __future__ import annotations

import pytest

from rutster.gateway.overload_guard import (
    LOOP_BUSY_LIMIT,
    LOOP_LAG_LIMIT_S,
    MIN_CALLS_MEASURED,
    NOTED_REFUSALS_PER_S,
    REASON_NODE_FULL,
    REASON_NODE_OVERLOADED,
    SAMPLE_INTERVAL_S,
    WINDOW_S,
    LoopSample,
    OverloadGuard,
    RefusalNotes,
)


def feed(
    guard: OverloadGuard,
    *,
    busy: float,
    calls: int,
    seconds: float = WINDOW_S,
    lag_s: float = 0.001,
    start: float = 0.0,
    cpu0: float = 0.0,
) -> tuple[float, float]:
    """Samples every SAMPLE_INTERVAL_S for ``seconds`` at a steady CPU share; returns
    the last (time, cpu) so a later feed can go on from there."""
    at, cpu = start, cpu0
    for _ in range(round(seconds / SAMPLE_INTERVAL_S) + 1):
        guard.on_sample(LoopSample(at, cpu, lag_s, calls))
        at += SAMPLE_INTERVAL_S
        cpu += busy * SAMPLE_INTERVAL_S
    return at - SAMPLE_INTERVAL_S, cpu - busy * SAMPLE_INTERVAL_S


def test_the_fixed_cap_counts_live_calls_and_admissions_waiting_for_media() -> None:
    guard = OverloadGuard(max_calls=3, measured=False)
    assert guard.refusal(live_calls=2, pending=0) is None
    assert guard.refusal(live_calls=2, pending=1) == REASON_NODE_FULL
    assert guard.refusal(live_calls=0, pending=3) == REASON_NODE_FULL
    with pytest.raises(ValueError):
        OverloadGuard(max_calls=0)


def test_nothing_is_refused_before_the_window_holds_enough_samples() -> None:
    guard = OverloadGuard()
    guard.on_sample(LoopSample(0.0, 0.0, 0.5, 50))
    guard.on_sample(LoopSample(0.1, 0.1, 0.5, 50))
    assert guard.reading().busy is None
    assert guard.refusal(live_calls=50, pending=0) is None


def test_a_busy_loop_refuses_once_enough_calls_are_live() -> None:
    guard = OverloadGuard()
    feed(guard, busy=0.9, calls=MIN_CALLS_MEASURED)
    reading = guard.reading()
    assert reading.busy == pytest.approx(0.9)
    assert guard.refusal(live_calls=MIN_CALLS_MEASURED, pending=0) == REASON_NODE_OVERLOADED
    # The same loop with fewer calls: not the calls' doing, nothing to relieve.
    assert guard.refusal(live_calls=MIN_CALLS_MEASURED - 1, pending=0) is None


def test_a_late_loop_refuses_even_when_its_thread_is_not_busy() -> None:
    # The CPU taken by others (a noisy neighbour): the loop wakes late though idle.
    guard = OverloadGuard()
    feed(guard, busy=0.2, calls=20, lag_s=LOOP_LAG_LIMIT_S * 1.5)
    assert guard.refusal(live_calls=20, pending=0) == REASON_NODE_OVERLOADED


def test_one_late_wake_up_in_the_window_is_not_overload() -> None:
    guard = OverloadGuard()
    at, cpu = feed(guard, busy=0.3, calls=20)
    guard.on_sample(LoopSample(at + 0.2, cpu + 0.03, 0.1, 20))  # one GC pause
    assert guard.refusal(live_calls=20, pending=0) is None


def test_the_projection_refuses_what_would_take_the_loop_past_its_limit() -> None:
    guard = OverloadGuard()
    # 20 calls at 2 % of a core each (40 %): room for 40 calls at the 80 % limit.
    feed(guard, busy=0.4, calls=20)
    capacity = guard.reading().capacity
    assert capacity == int(LOOP_BUSY_LIMIT * 20 / 0.4) == 40
    assert guard.refusal(live_calls=20, pending=19) is None
    assert guard.refusal(live_calls=20, pending=20) == REASON_NODE_OVERLOADED


def test_the_window_forgets_a_past_burst() -> None:
    guard = OverloadGuard()
    at, cpu = feed(guard, busy=0.95, calls=30)
    assert guard.refusal(live_calls=30, pending=0) == REASON_NODE_OVERLOADED
    feed(guard, busy=0.3, calls=30, start=at + SAMPLE_INTERVAL_S, cpu0=cpu, seconds=WINDOW_S + 0.3)
    assert guard.reading().busy == pytest.approx(0.3, abs=0.02)
    assert guard.refusal(live_calls=30, pending=0) is None


def test_a_clock_that_goes_back_restarts_the_window() -> None:
    guard = OverloadGuard()
    feed(guard, busy=0.9, calls=30, start=100.0, cpu0=50.0)
    guard.on_sample(LoopSample(1.0, 50.0, 0.0, 30))
    assert guard.reading().busy is None
    assert guard.refusal(live_calls=30, pending=0) is None


def test_off_keeps_only_the_fixed_cap() -> None:
    guard = OverloadGuard(measured=False)
    feed(guard, busy=0.99, calls=50, lag_s=1.0)
    assert guard.refusal(live_calls=50, pending=0) is None


def test_a_few_refusals_a_second_are_written_down_and_the_rest_only_counted() -> None:
    notes = RefusalNotes()
    taken = [notes.take(100.0 + i / 100) for i in range(50)]  # 50 within one second
    assert sum(taken) == NOTED_REFUSALS_PER_S and all(taken[:NOTED_REFUSALS_PER_S])
    assert notes.take(101.0)  # a new second
