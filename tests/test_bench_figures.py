"""The load benchmarks' figures are what their labels say: the pacer's p99 read from its
Prometheus histogram, the callers' p99 jitter pooled over every media message, and a
profile sample charged to the part of the gateway it was in."""

from __future__ import annotations

import pytest

from bench.call_profile import OTHER, charge
from bench.concurrent_calls import histogram_p99_ms, pooled_jitter_p99_ms
from rutster.tools.twilio_simulator import SimulatedCallResult

PREFIX = "rutster_pacer_lateness_seconds_bucket|"


def histogram(counts: dict[str, float]) -> dict[str, float]:
    """Cumulative bucket counts by upper bound, as /metrics gives them."""
    return {PREFIX + bound: count for bound, count in counts.items()}


def test_the_pacer_p99_is_interpolated_inside_its_bucket() -> None:
    # 1000 ticks: 900 within 1 ms, 1000 within 5 ms. The 990th lies 90/100 of the way
    # from 1 ms to 5 ms: 4.6 ms, where the bucket's bound alone would say 5 ms.
    after = histogram({"0.001": 900, "0.005": 1000, "+Inf": 1000})
    assert histogram_p99_ms({}, after) == pytest.approx(4.6)
    # Only what happened between the two scrapes counts.
    before = histogram({"0.001": 100, "0.005": 100, "+Inf": 100})
    later = histogram({"0.001": 1000, "0.005": 1100, "+Inf": 1100})
    assert histogram_p99_ms(before, later) == pytest.approx(4.6)
    assert histogram_p99_ms({}, histogram({"0.001": 0, "+Inf": 0})) == 0.0


def test_the_callers_p99_is_one_percentile_over_every_message() -> None:
    def call(deviations: list[float]) -> SimulatedCallResult:
        arrivals, t = [], 0.0
        for extra in [0.0, *deviations]:
            t += 20.0 + extra
            arrivals.append((t, 20.0))
        return SimulatedCallResult(call_sid="CA", stream_sid="MZ", arrivals=arrivals)

    # 99 calls whose messages are all on time, one call with every message 30 ms late:
    # the largest per-call p99 would say 30 ms; over every message, 1 % are late.
    calls = [call([0.0] * 100) for _ in range(99)] + [call([30.0] * 100)]
    assert pooled_jitter_p99_ms(calls) == pytest.approx(0.0, abs=30.0 * 0.02)
    assert max(c.inter_arrival_jitter_ms(99.0) for c in calls) == pytest.approx(30.0)


def test_a_profile_sample_is_charged_to_the_innermost_part_on_its_stack() -> None:
    raw = "\n".join(
        [
            # The VAD runs inside the reflex loop: the VAD, not the reflex loop.
            "run (a.py:1);ReflexLoop.on_caller_frame (r.py:2);SileroDetector.process (v.py:3) 7",
            "run (a.py:1);ReflexLoop.on_caller_frame (r.py:2) 2",
            "run (a.py:1);select (selectors.py:9) 1",
            "not a sample line",
        ]
    )
    assert dict(charge(raw)) == {
        "VAD (Silero, its cascade)": 7,
        "reflex state machine": 2,
        OTHER: 1,
    }
