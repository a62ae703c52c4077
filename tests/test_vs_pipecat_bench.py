"""bench/vs_pipecat.py's judging: what counts as a carried call, whose gap a gap is, the
echo lag a caller heard, and the largest level both systems are credited with. (The
benchmark itself needs Pipecat's own virtualenv and minutes of load: run by hand.)"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest

from bench.vs_pipecat import (
    WITHOUT_PARTS,
    WITHOUT_SITE,
    LevelResult,
    carried,
    core_kept_awake,
    cost_spread,
    echo_lag_ms,
    lag_start_and_growth_ms,
    largest_carried,
    server_gaps,
    without_env,
)
from rutster.tools.twilio_simulator import SimulatedCallResult

RATE = 8_000
ROOT = Path(__file__).resolve().parent.parent


Spans = list[tuple[float, float]]


def call(audio_ms: float, gaps: Spans, stalls: Spans | None = None) -> SimulatedCallResult:
    return SimulatedCallResult(
        call_sid="CA1",
        stream_sid="MZ1",
        audio_ms_received=audio_ms,
        gaps=list(gaps),
        harness_stalls=list(stalls or []),
    )


@pytest.mark.parametrize(
    ("audio_ms", "gaps", "stalls", "expected"),
    [
        (20_000, [], [], True),
        (19_000, [(500.0, 60.0)], [], True),  # exactly 95 % back, a 60 ms gap
        (18_999, [], [], False),  # less than 95 % back
        (20_000, [(500.0, 61.0)], [], False),  # a gap over 60 ms
        # The same gap while the simulator itself ran 90 ms late: its gap, not the server's.
        (20_000, [(500.0, 95.0)], [(560.0, 90.0)], True),
        (20_000, [(500.0, 95.0)], [(2_000.0, 90.0)], False),  # a stall elsewhere does not excuse it
    ],
)
def test_a_call_is_carried_by_issue_18s_rule(
    audio_ms: float, gaps: Spans, stalls: Spans, expected: bool
) -> None:
    assert carried(call(audio_ms, gaps, stalls), 20_000.0) is expected


def test_only_the_servers_gaps_count() -> None:
    result = call(20_000, [(100.0, 30.0), (500.0, 95.0)], [(560.0, 90.0)])
    assert server_gaps(result) == [30.0]


def test_the_echo_lag_is_what_the_caller_heard() -> None:
    rng = np.random.default_rng(7)
    sent = (rng.standard_normal(RATE * 6) * 3_000).astype(np.int16)
    lag = int(0.112 * RATE)  # 112 ms
    heard = np.concatenate([np.zeros(lag, np.int16), sent])
    result = SimulatedCallResult(call_sid="CA1", stream_sid="MZ1", heard_pcm=heard.tobytes())
    assert echo_lag_ms(sent.tobytes(), result) == pytest.approx(112.0, abs=0.2)
    silence = SimulatedCallResult(call_sid="CA1", stream_sid="MZ1", heard_pcm=bytes(len(heard) * 2))
    assert echo_lag_ms(sent.tobytes(), silence) is None  # nothing came back: no lag to report


def test_a_calls_lag_at_its_start_and_its_growth() -> None:
    # Six segments or more: the first three's median is the start, the last three's less
    # it the growth (a call late from its first word grows 0; one that drifted, more).
    assert lag_start_and_growth_ms([500.0, 502.0, 498.0, 500.0, 501.0, 500.0]) == (500.0, 0.0)
    assert lag_start_and_growth_ms([48.0, 49.0, 48.0, 60.0, 75.0, 90.0, 88.0]) == (48.0, 40.0)
    assert lag_start_and_growth_ms([48.0] * 5) is None  # too few to tell them apart


def test_the_lag_note_names_what_put_calls_over_the_limit() -> None:
    row = LevelResult("rutster", 3, 3, 50.0, 1.0, 1.0, [50.0, 300.0, 130.0])
    row.starts_and_growth_ms = [(49.0, 1.0), (300.0, 0.0), (60.0, 70.0)]
    assert row.lag_note() == (
        "  lag growth within a call P50 1 ms, max 70; calls over 120 ms: 1 from their "
        "first word, 1 grew past it"
    )
    assert "too few segments" in LevelResult("x", 1, 1, 1.0, 1.0, 1.0, []).lag_note()


def level(calls: int, carried_calls: int) -> LevelResult:
    return LevelResult("x", calls, carried_calls, 50.0, 1.0, 1.0, [])


def test_a_level_counts_only_when_every_smaller_level_carried_too() -> None:
    assert largest_carried([level(10, 10), level(20, 20), level(30, 29)]) == 20
    # A failure at 15 is not made up for by a luckier 20.
    assert largest_carried([level(10, 10), level(15, 5), level(20, 20)]) == 10
    assert largest_carried([level(10, 9)]) == 0


def costed(calls: int, cpu: float, idle: float) -> LevelResult:
    return LevelResult("rutster", calls, calls, cpu, idle, 1.0, [50.0])


def test_the_cost_per_call_over_idle_and_its_spread_over_the_levels_carried() -> None:
    rows = [costed(5, 30.0, 2.0), costed(10, 42.0, 2.0), costed(20, 72.0, 2.0)]
    rows.append(costed(30, 92.0, 2.0))
    assert rows[1].per_call_above_idle == pytest.approx(4.0)
    assert rows[3].per_call_above_idle == pytest.approx(3.0)
    # 5 calls is below the issue's range; 30 is not carried whole here (up to 20).
    assert cost_spread(rows, 20) == (
        "CPU per call over idle, levels of 10 to 20 calls (those measured): 3.50-4.00 %, "
        "the highest 14 % above the lowest (issue 18: within 20 %)"
    )
    assert "fewer than two levels" in cost_spread(rows, 10)
    # A run that began above 10 calls names the levels it measured.
    assert cost_spread(rows[2:], 30).startswith(
        "CPU per call over idle, levels of 20 to 30 calls (those measured): 3.00-3.50 %"
    )


def limited(calls: int, lag_p99: float, rss_mib: float = 1.0) -> LevelResult:
    return LevelResult("rutster", calls, calls, 50.0, 1.0, rss_mib, [50.0] * 98 + [lag_p99] * 2)


def test_the_goals_limits_on_latency_and_memory_bound_the_level_credited() -> None:
    rows = [limited(10, 90.0), limited(20, 110.0), limited(30, 180.0), limited(40, 100.0)]
    assert largest_carried(rows) == 40  # every call carried at every level
    # Lag P99 over 120 ms at 30: neither 30 nor the luckier 40 count against the limits.
    assert largest_carried(rows, within_limits=True) == 20
    # Over 1 MiB of RSS a call (12 MiB over 10 calls) is outside the limits too.
    assert largest_carried([limited(10, 90.0, rss_mib=12.0)], within_limits=True) == 0
    assert largest_carried([limited(10, 90.0, rss_mib=9.0)], within_limits=True) == 10


def test_keeping_the_core_awake_runs_one_idle_class_spinner_there_and_stops_it() -> None:
    me = psutil.Process()
    core = [sorted(os.sched_getaffinity(0))[-1]]
    before = {child.pid for child in me.children()}  # the suite's own services, if any
    with core_kept_awake(core, enabled=False):
        assert {child.pid for child in me.children()} == before
    with core_kept_awake(core, enabled=True):
        (spinner,) = [child for child in me.children() if child.pid not in before]
        assert spinner.cpu_affinity() == core
        # Its own first line lowers it to SCHED_IDLE; give it that moment.
        for _ in range(100):
            if os.sched_getscheduler(spinner.pid) == os.SCHED_IDLE:
                break
            psutil.wait_procs([spinner], timeout=0.02)
        assert os.sched_getscheduler(spinner.pid) == os.SCHED_IDLE
    assert not spinner.is_running()


def test_the_benchmark_and_its_sitecustomize_name_the_same_parts() -> None:
    spec = importlib.util.spec_from_file_location(
        "without_parts", WITHOUT_SITE / "sitecustomize.py"
    )
    assert spec is not None and spec.loader is not None
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)  # installs nothing: not a serve process
    assert site.PARTS == WITHOUT_PARTS


def test_without_names_the_cut_for_the_gateway_alone() -> None:
    assert without_env(None) is None
    env = without_env("vad")
    assert env is not None
    assert env["RUTSTER_BENCH_WITHOUT"] == "vad"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(WITHOUT_SITE)
    with pytest.raises(ValueError, match="--without is one of vad, reflex"):
        without_env("echo_gate")


#: Run as ``python PROBE serve`` (the sitecustomize acts only in a ``serve`` process): says
#: which implementation each part the cut touches has, and what the VAD hears of speech.
PROBE = """
import numpy as np
from rutster.gateway.media_engine import MediaEngine
from rutster.gateway.reflex import ReflexLoop
from rutster.media.vad import CascadeDetector, EnergyDetector
loud = (np.sin(np.arange(160) * 0.3) * 12000).astype("<i2").tobytes()
energy = EnergyDetector()
heard = max(energy.process(loud) for _ in range(10))
print(ReflexLoop.on_caller_frame.__name__, MediaEngine._render.__name__,
      CascadeDetector.process.__name__, heard)
"""


def run_probe(tmp_path: Path, part: str | None) -> subprocess.CompletedProcess[str]:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "RUTSTER_BENCH_WITHOUT"}
    env.update(without_env(part) or {})
    return subprocess.run(
        [sys.executable, str(probe), "serve"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("part", "names"),
    [
        (None, ["on_caller_frame", "_render", "process"]),
        ("vad", ["on_caller_frame", "_render", "_nothing_heard"]),
        ("reflex", ["_no_actions", "_not_rendered", "process"]),
    ],
)
def test_the_cut_replaces_only_its_part_in_a_serve_process(
    tmp_path: Path, part: str | None, names: list[str]
) -> None:
    done = run_probe(tmp_path, part)
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    assert words[:3] == names
    # The energy detector is a VAD too: cut with the others, it hears nothing.
    assert (float(words[3]) == 0.0) == (part == "vad")


def test_an_unknown_cut_stops_the_process_with_the_names_it_takes(tmp_path: Path) -> None:
    env = without_env("vad")
    assert env is not None
    probe = tmp_path / "probe.py"
    probe.write_text("print('ran')\n")
    done = subprocess.run(
        [sys.executable, str(probe), "serve"],
        cwd=ROOT,
        env={**os.environ, **env, "RUTSTER_BENCH_WITHOUT": "echo_gate"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "RUTSTER_BENCH_WITHOUT is one of vad, reflex, not 'echo_gate'" in done.stderr
