"""The reflex loop's figures: barge-in latency, false barge-ins, end of turn, cost.

Everything runs on the virtual-time rig (``gateway/reflex_rig.py``): the real
reflex loop, VAD and echo gate, with the assistant's audio coming back
through a simulated phone line (delayed, attenuated, 8 kHz μ-law) and
recorded speech from the caller.

- **barge-in latency**: true speech onset (first 20 ms of the caller's segment
  above -40 dBFS) → the provider ``clear`` (the pause), P50/P95, over caller
  segments x start times x echo conditions;
- **false barge-ins** per minute of assistant playout, on echo-only input (the
  assistant's own speech coming back) and on noise-only input (bursts of
  white noise and clicks over the echo): pauses, and confirmed cuts;
- **end-of-turn latency**: end of the caller's speech → ``speech_stopped``;
- **cost**: µs per caller frame inside the reflex loop (VAD + echo gate +
  state machine), and % of one core per call.

Speech: ``tests/fixtures/audio/caller_speech_8k.wav`` (fluent stretches) and
``espeak_speech_16k.wav`` (synthesised utterances) as the caller; the same
fixture's other stretches and the mock Realtime voice as the assistant.
Usage: ``python bench/reflex.py``
"""

from __future__ import annotations

import statistics
import wave
from pathlib import Path

import numpy as np

from brains.realtime.mock_voice import synthesize_reply
from brains.tap import SpeechStarted, SpeechStopped
from gateway.reflex import ClearProvider
from gateway.reflex_rig import FRAME_MS, RATE, ReflexRig
from media.resample import StreamResampler
from trunk.twilio.simulator import read_wav_8k

FIXTURES = Path(__file__).resolve().parent.parent / "tests/fixtures/audio"
#: Echo conditions: (round-trip delay ms, echo return loss dB); none = a clean line.
ECHO_CONDITIONS: tuple[tuple[float, float | None], ...] = (
    (0.0, None),
    (120.0, 10.0),
    (250.0, 15.0),
    (400.0, 25.0),
)
#: Goals from the issue.
PAUSE_P95_GOAL_MS = 150.0
REFLEX_CORE_GOAL_PCT = 0.2


def resample(pcm: bytes, rate: int) -> bytes:
    up = StreamResampler(rate, RATE)
    return up.process(pcm) + up.flush()


def fixture_segments() -> list[bytes]:
    pcm = read_wav_8k(FIXTURES / "caller_speech_8k.wav")
    out = []
    for start in (9.0, 10.5, 12.0, 20.0, 21.5):
        a = int(start * 8000) * 2
        out.append(resample(pcm[a : a + 12_000 * 2], 8_000))  # 1.5 s each
    return out


def espeak_segments() -> list[bytes]:
    with wave.open(str(FIXTURES / "espeak_speech_16k.wav"), "rb") as w:
        pcm = w.readframes(w.getnframes())
        rate = w.getframerate()
    x = np.frombuffer(pcm, dtype="<i2")
    voiced = np.abs(x) > 300
    segments: list[bytes] = []
    i = 0
    while i < x.size and len(segments) < 6:
        if voiced[i]:
            j = i
            quiet = 0
            while j < x.size and quiet < rate // 4:
                quiet = 0 if voiced[j] else quiet + 1
                j += 1
            if j - i > rate // 2:
                segments.append(resample(x[i : j - quiet].tobytes(), rate))
            i = j
        else:
            i += 1
    return segments


def onset_ms(pcm24: bytes) -> float:
    x = np.frombuffer(pcm24, dtype="<i2").astype(np.float64)
    for i in range(0, x.size - 480, 480):
        if np.sqrt(np.mean(x[i : i + 480] ** 2)) > 32768 * 10 ** (-40 / 20):
            return i / RATE * 1000
    return 0.0


def speech_end_ms(pcm24: bytes) -> float:
    x = np.frombuffer(pcm24, dtype="<i2").astype(np.float64)
    last = 0
    for i in range(0, x.size - 480, 480):
        if np.sqrt(np.mean(x[i : i + 480] ** 2)) > 32768 * 10 ** (-40 / 20):
            last = i + 480
    return last / RATE * 1000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def main() -> None:
    assistant_voices = {
        "mock voice": synthesize_reply(6_000),
        "recorded": resample(read_wav_8k(FIXTURES / "caller_speech_8k.wav")[48_000:144_000], 8_000),
    }
    callers = fixture_segments() + espeak_segments()
    latencies: list[float] = []
    by_condition: dict[str, list[float]] = {}
    misses = 0
    confirmed = 0
    reflex_ns = 0
    frames = 0
    for delay, loss in ECHO_CONDITIONS:
        for voice in assistant_voices.values():
            for n, caller in enumerate(callers):
                at_s = 1.0 + 0.37 * (n % 5)
                rig = ReflexRig(seconds=at_s + 3.0, echo_delay_ms=delay or 200, echo_loss_db=loss)
                rig.say(voice, "reply", at_s=0.2)
                rig.caller_audio(caller, at_s=at_s)
                rig.run()
                reflex_ns += rig.reflex_ns
                frames += len(rig.steps)
                pause = rig.first(ClearProvider)
                if pause is None:
                    misses += 1
                    continue
                latency = pause.at_ms - (at_s * 1000 + onset_ms(caller))
                latencies.append(latency)
                label = "no echo" if loss is None else f"echo {delay:.0f} ms {loss:.0f} dB"
                by_condition.setdefault(label, []).append(latency)
                confirmed += any(
                    isinstance(a, SpeechStarted) and a.interrupted
                    for _, a in rig.actions_of(SpeechStarted)
                )
    trials = len(latencies) + misses
    print(
        f"barge-in: {trials} trials ({len(callers)} caller segments x 2 assistant voices x "
        f"{len(ECHO_CONDITIONS)} echo conditions)"
    )
    print(
        f"  onset -> pause (provider clear)  P50 {statistics.median(latencies):.0f} ms  "
        f"P95 {pct(latencies, 95):.0f} ms  max {max(latencies):.0f} ms  "
        f"(goal P95 <= {PAUSE_P95_GOAL_MS:.0f} ms); missed {misses}; confirmed {confirmed}"
    )

    for label, values in by_condition.items():
        print(
            f"    {label:18} P50 {statistics.median(values):4.0f} ms  P95 {pct(values, 95):4.0f} ms"
        )

    # False barge-ins: long assistant playout, echo only / echo + noise bursts.
    rng = np.random.default_rng(11)
    playout_s = 0.0
    false_pauses = {"echo only": 0, "noise only": 0}
    false_cuts = {"echo only": 0, "noise only": 0}
    minutes = {"echo only": 0.0, "noise only": 0.0}
    long_voice = resample(read_wav_8k(FIXTURES / "caller_speech_8k.wav")[24_000:], 8_000)
    for delay, loss in ECHO_CONDITIONS[1:]:
        for kind in ("echo only", "noise only"):
            rig = ReflexRig(seconds=26.0, echo_delay_ms=delay, echo_loss_db=loss)
            rig.say(long_voice, "reply", at_s=0.2)
            if kind == "noise only":
                for t in np.arange(1.0, 25.0, 1.7):
                    ms = int(rng.integers(40, 300))
                    level = float(rng.uniform(-35, -15))
                    burst = rng.normal(0, 32768 * 10 ** (level / 20), ms * RATE // 1000)
                    rig.caller_audio(np.clip(burst, -32768, 32767).astype("<i2").tobytes(), t)
            rig.run()
            reflex_ns += rig.reflex_ns
            frames += len(rig.steps)
            minutes[kind] += 25.0 / 60
            false_pauses[kind] += rig.reflex.counters.pauses
            false_cuts[kind] += rig.reflex.counters.confirmed
            playout_s += 25.0
    for kind in ("echo only", "noise only"):
        print(
            f"false barge-ins, {kind:10}: {false_pauses[kind] / minutes[kind]:.2f} pauses/min, "
            f"{false_cuts[kind] / minutes[kind]:.2f} confirmed cuts/min "
            f"over {minutes[kind]:.1f} min of assistant playout"
        )

    # End of turn: caller alone, speech end -> speech_stopped.
    eot: list[float] = []
    for caller in callers:
        rig = ReflexRig(seconds=4.0, echo_loss_db=None)
        rig.caller_audio(caller, at_s=0.5)
        rig.run()
        reflex_ns += rig.reflex_ns
        frames += len(rig.steps)
        stop = rig.first(SpeechStopped)
        if stop is not None:
            eot.append(stop.at_ms - (500 + speech_end_ms(caller)))
    print(
        f"end of turn: speech end -> speech_stopped  P50 {statistics.median(eot):.0f} ms  "
        f"P95 {pct(eot, 95):.0f} ms  ({len(eot)}/{len(callers)} turns; configured "
        "trailing silence 500 ms)"
    )
    per_frame_us = reflex_ns / frames / 1000
    core_pct = per_frame_us / (FRAME_MS * 1000) * 100
    print(
        f"reflex cost: {per_frame_us:.1f} us per 20 ms caller frame (VAD + echo gate + state) "
        f"= {core_pct:.3f} % of one core per call (goal <= {REFLEX_CORE_GOAL_PCT} %), "
        f"over {frames} frames"
    )


if __name__ == "__main__":
    main()
