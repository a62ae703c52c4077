"""CallerAudioBudget: a call's audio at real time plus a burst (issue 14, finding 1)."""

from __future__ import annotations

import random

import pytest

from rutster.media.ingress_budget import CALLER_AUDIO_BURST_MS, CallerAudioBudget


def test_a_real_time_stream_with_jitter_is_always_admitted() -> None:
    budget = CallerAudioBudget()
    rng = random.Random(7)
    for n in range(30_000):  # 10 minutes of 20 ms messages, each up to 200 ms late
        assert budget.admit(20.0, n * 20.0 + rng.uniform(0.0, 200.0))
    assert budget.refused == 0


def test_a_held_back_second_is_admitted_when_released() -> None:
    budget = CallerAudioBudget()
    for n in range(100):
        assert budget.admit(20.0, n * 20.0)
    # The network holds the stream 1 s, then releases the 50 messages at once.
    released = [budget.admit(20.0, 3_000.0) for _ in range(50)]
    assert all(released)


def test_one_message_longer_than_the_burst_is_refused_whole() -> None:
    budget = CallerAudioBudget()
    assert not budget.admit(8_192.0, 0.0)  # a 64 KiB μ-law payload: 8 s of audio
    assert budget.refused == 1 and budget.refused_ms == 8_192.0
    assert budget.admit(20.0, 20.0)  # the next honest frame is not punished for it


def test_a_flood_gets_real_time_plus_one_burst() -> None:
    budget = CallerAudioBudget()
    admitted_ms = 0.0
    for n in range(10_000):  # 10x real time for 20 s
        if budget.admit(20.0, n * 2.0):
            admitted_ms += 20.0
    assert admitted_ms <= 20_000.0 + CALLER_AUDIO_BURST_MS + 20.0
    assert admitted_ms >= 20_000.0


def test_time_going_back_refills_nothing() -> None:
    budget = CallerAudioBudget(burst_ms=100.0)
    assert budget.admit(100.0, 1_000.0)
    assert not budget.admit(20.0, 500.0)


@pytest.mark.parametrize("burst", [0.0, -1.0, float("nan"), float("inf")])
def test_a_burst_must_be_a_positive_number(burst: float) -> None:
    with pytest.raises(ValueError):
        CallerAudioBudget(burst_ms=burst)
