"""One judgement of an echo call heard through the Twilio simulator, shared by the e2e tests.

The echo brain sends the caller's audio straight back, so what the caller
heard is what it said, a round trip later. Judged window by window
(:func:`tools.twilio_simulator.echo_windows`), each at its own delay:

- every window with speech correlates at least :data:`MIN_WINDOW_CORRELATION`,
  except a lone window where the delay stepped and was won back: the windows
  either side of it are good (a stall may move the delay mid-window, and a
  window holding two delays correlates less; :func:`transient_steps_only`), or,
  right after windows not judged for a simulator stall, the one good beside it
  (where the pacer won back what the stall added);
- the delay at the end is within :data:`MAX_LASTING_STEP_SAMPLES` of the
  delay at the start: a stall may cost a short gap, never a latency step for
  the rest of the call (``media/pacer.py`` wins it back);
- no gap was heard.

The simulator stands in for Twilio, whose playback keeps its own clock. When
the simulator itself ran late (its process descheduled on a loaded machine),
the arrival times it recorded are its own error: windows and gaps around such
a stall are not judged, and the delay it left is added to what may last.
"""

from __future__ import annotations

from dataclasses import dataclass

from rutster.tools.twilio_simulator import SimulatedCallResult, best_lag_correlation, echo_windows

#: Text that starts every echo-quality failure (tests/realtime_echo.py reruns on it).
ECHO_SHORTFALL = "echo shortfall"
#: Correlation a window of echoed speech must reach (μ-law both ways and two
#: resamplings leave about 0.94 on the project's recording: measured).
MIN_WINDOW_CORRELATION = 0.9
#: Largest lasting delay change (one 20 ms frame at 8 kHz): ITU-T G.114 puts the
#: one-way delay that conversation tolerates at 150 ms; a frame is far below what
#: a caller notices, and the pacer sheds whole silent frames.
MAX_LASTING_STEP_SAMPLES = 160
#: The start's delay is taken from this much of the call (3 s, several words).
START_BYTES = 3 * 8000 * 2
#: The end of the caller's audio not judged (40 ms, 8 kHz s16le): the simulator stops
#: sending frames when its audio ends (a real phone never does mid-call), so what the
#: resamplers hold of it (2.6 ms each way, media/polyphase.py) is never echoed, nor
#: the last partial frame.
END_TRIM_BYTES = 40 * 8 * 2
#: A gap this close to a stall of the simulator (ms) is the simulator's doing.
STALL_GAP_MARGIN_MS = 100.0


def transient_steps_only(
    windows: list[tuple[float, int]],
    max_step: int,
    label: str = "",
    after_stall: list[bool] | None = None,
) -> str | None:
    """None when ``windows`` ((correlation, lag) in call order) show an intact echo.

    Each window correlates at least :data:`MIN_WINDOW_CORRELATION`, but for
    lone spoiled windows between good ones; the last good window's lag is within
    ``max_step`` of the first's. A window marked in ``after_stall`` (it follows
    windows not judged because the simulator stalled) may be spoiled at either end
    too, when its one neighbour is good: the delay the stall added is won back in
    it, as a lone window between good ones may hold a step. Otherwise, what is wrong.
    """
    good = [c >= MIN_WINDOW_CORRELATION for c, _ in windows]
    forgiven = after_stall if after_stall is not None else [False] * len(windows)
    if not good:
        return f"{label}the first and last windows must be echoed whole"
    for end, neighbour in ((0, 1), (len(good) - 1, len(good) - 2)):
        if not good[end] and not (forgiven[end] and 0 <= neighbour < len(good) and good[neighbour]):
            return f"{label}the first and last windows must be echoed whole"
    for i, ok in enumerate(good):
        if ok or i in (0, len(good) - 1):
            continue
        if not (good[i - 1] and good[i + 1]):
            return f"{label}two windows in a row not echoed whole (from window {i})"
    lags = [lag for (_, lag), ok in zip(windows, good, strict=True) if ok]
    if abs(lags[-1] - lags[0]) > max_step:
        return f"{label}the delay moved {lags[-1] - lags[0]} samples and stayed"
    return None


@dataclass(frozen=True)
class EchoJudgement:
    """One echo call judged: what is wrong (None: intact) and the figures behind it."""

    problem: str | None
    #: Round trip at the start of the call (samples at 8 kHz); 0 when nothing was judged.
    lag_samples: int
    #: Correlation of the judged windows (not those around a simulator stall).
    correlations: tuple[float, ...]
    #: Last good window's delay minus the first's (samples): a lasting latency step.
    step_samples: int
    #: Gaps heard that were not the simulator's own stalls.
    gaps: int


def judge_echo(
    sent: bytes, result: SimulatedCallResult, *, gaps_allowed: bool = False
) -> EchoJudgement:
    """Judge whether ``result`` heard ``sent`` echoed whole (see the module docstring)."""
    sent = sent[:-END_TRIM_BYTES]
    _, base_lag = best_lag_correlation(sent[:START_BYTES], result.heard_pcm)
    windows = echo_windows(sent, result, base_lag_samples=base_lag)
    judged = [w for w in windows if not w.harness_stalled]
    summary = ", ".join(
        f"{w.start_ms / 1000:.0f}s {w.correlation:.2f}@{w.lag_samples / 8:.0f}ms"
        + ("(sim stalled)" if w.harness_stalled else "")
        for w in windows
    )
    detail = f"windows [{summary}]; sim stalls {result.harness_stalls}; gaps {result.gaps}"
    gaps = [
        (at, ms)
        for at, ms in result.gaps
        if not any(
            abs(at - stall_at) <= STALL_GAP_MARGIN_MS + ms for stall_at, _ in result.harness_stalls
        )
    ]
    if not judged:
        return EchoJudgement(f"no window could be judged: {detail}", 0, (), 0, len(gaps))
    good = [w.lag_samples for w in judged if w.correlation >= MIN_WINDOW_CORRELATION]
    step = good[-1] - good[0] if good else 0
    correlations = tuple(w.correlation for w in judged)
    harness_delay = round(sum(ms for _, ms in result.harness_stalls) * 8)
    stalled_before = [False] + [w.harness_stalled for w in windows[:-1]]
    after_stall = [
        before for w, before in zip(windows, stalled_before, strict=True) if not w.harness_stalled
    ]
    problem = transient_steps_only(
        [(w.correlation, w.lag_samples) for w in judged],
        MAX_LASTING_STEP_SAMPLES + harness_delay,
        after_stall=after_stall,
    )
    if problem is not None:
        problem = f"{problem}: {detail}"
    elif gaps and not gaps_allowed:
        problem = f"gaps heard: {detail}"
    return EchoJudgement(problem, judged[0].lag_samples, correlations, step, len(gaps))


def assert_echo_intact(
    sent: bytes, result: SimulatedCallResult, *, gaps_allowed: bool = False
) -> int:
    """Assert ``result`` heard ``sent`` echoed whole; return the round trip (samples)."""
    judgement = judge_echo(sent, result, gaps_allowed=gaps_allowed)
    assert judgement.problem is None, f"{ECHO_SHORTFALL}: {judgement.problem}"
    return judgement.lag_samples
