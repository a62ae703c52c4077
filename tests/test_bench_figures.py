"""The load benchmarks' figures are what their labels say: the pacer's p99 read from its
Prometheus histogram, the callers' p99 jitter pooled over every media message, and a
profile sample charged to the part of the gateway it was in."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from bench.call_profile import ENGINE_ENTRIES, OTHER, TIMER_ROWS, TIMERS_SITE, charge, read_timers
from bench.concurrent_calls import histogram_p99_ms, pooled_jitter_p99_ms
from bench.vs_pipecat import median_over_rounds
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


def timers_site() -> ModuleType:
    """bench/engine_timers/sitecustomize.py, loaded under another name (it installs
    nothing unless RUTSTER_BENCH_TIMERS is set in a process run as ``serve``)."""
    spec = importlib.util.spec_from_file_location("engine_timers", TIMERS_SITE / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_part_the_timers_wrap_exists_and_every_row_is_timed() -> None:
    site = timers_site()
    timed = set()
    for module_name, class_name, method_name in site.TIMED:
        cls = getattr(importlib.import_module(module_name), class_name)
        assert callable(getattr(cls, method_name)), (class_name, method_name)
        timed.add(f"{class_name}.{method_name}")
    assert {name for name, _ in TIMER_ROWS} == timed
    assert set(ENGINE_ENTRIES) <= timed


def test_a_timed_method_adds_its_cpu_time_and_calls(tmp_path: Path) -> None:
    site = timers_site()
    total = [0, 0]

    def busy(n: int) -> int:
        return sum(i * i for i in range(n))

    timed = site._timed(busy, total)
    assert timed(200_000) == busy(200_000)
    assert total[1] == 1 and total[0] > 0
    path = tmp_path / "timers.json"
    path.write_text(json.dumps({"EchoGate.capture": {"cpu_ns": 5, "calls": 2}}))
    assert read_timers(path) == {"EchoGate.capture": (5, 2)}


def test_the_ratio_over_rounds_is_the_median_of_the_rounds_that_gave_one() -> None:
    assert median_over_rounds([3.0, 4.0, None, 2.0]) == (
        "3.00x, 4.00x, -, 2.00x; median 3.00x over 3 rounds"
    )
    assert median_over_rounds([3.0, 4.0]) == "3.00x, 4.00x; median 3.50x over 2 rounds"
    assert median_over_rounds([None]) == "-: no round gave a ratio"


def test_call_profile_cuts_parts_only_in_its_profile() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.call_profile", "--timers", "--without", "vad"],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "--without is an option of the profile only" in done.stderr
