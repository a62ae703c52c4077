"""Energy endpointer: real speech and synthetic signals on a virtual clock."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from rutster.media.endpointing import (
    ABS_FLOOR_DBFS,
    DIGITAL_SILENCE_DBFS,
    MIN_SPEECH_MS,
    NOISE_WINDOW_MS,
    ONSET_WINDOW_MS,
    TRAILING_SILENCE_MS,
    EndpointerConfig,
    EndpointerEvent,
    EnergyEndpointer,
    FrameLengthError,
    SpeechStarted,
    TurnEnded,
    frame_level_dbfs,
    samples_level_dbfs,
)
from rutster.media.formats import FRAME_MS as FRAME_MS_INT
from rutster.media.formats import (
    NARROWBAND_FRAME_BYTES,
    NARROWBAND_FRAME_SAMPLES,
    NARROWBAND_SAMPLE_RATE,
)
from rutster.tools.twilio_simulator import read_wav_8k

FIXTURE = Path(__file__).parent / "fixtures" / "audio" / "caller_speech_8k.wav"
FRAME_MS = float(FRAME_MS_INT)
MIN_SPEECH_FRAMES = MIN_SPEECH_MS // FRAME_MS_INT
TRAILING_FRAMES = TRAILING_SILENCE_MS // FRAME_MS_INT
#: Level of the synthetic "voice" and of the quiet background around it.
VOICE_DBFS = -20.0
BACKGROUND_DBFS = -70.0

Signal = npt.NDArray[np.float64]


# ---- signal helpers ------------------------------------------------------------


def _samples(ms: float) -> int:
    return round(ms * NARROWBAND_SAMPLE_RATE / 1000)


def _scale(x: Signal, dbfs: float) -> Signal:
    """Scale ``x`` to an RMS of ``dbfs`` (0 dBFS: RMS 32768)."""
    rms = float(np.sqrt(np.mean(x * x)))
    scaled: Signal = x * (32768.0 * 10.0 ** (dbfs / 20.0) / rms)
    return scaled


def voiced(ms: float, dbfs: float = VOICE_DBFS) -> Signal:
    """A steady vowel-like sound: 120 Hz with ten harmonics falling off as 1/k."""
    t = np.arange(_samples(ms)) / NARROWBAND_SAMPLE_RATE
    k = np.arange(1, 11)[:, np.newaxis]
    x: Signal = (np.sin(2 * np.pi * 120.0 * k * t + k) / k).sum(axis=0)
    return _scale(x, dbfs)


def noise(ms: float, dbfs: float = BACKGROUND_DBFS, seed: int = 0) -> Signal:
    """Seeded white noise (deterministic)."""
    return _scale(np.random.default_rng(seed).standard_normal(_samples(ms)), dbfs)


def hum(ms: float, dbfs: float, offset_ms: float = 0.0) -> Signal:
    """Mains hum: 60 Hz plus its third harmonic, steady."""
    t = (np.arange(_samples(ms)) + _samples(offset_ms)) / NARROWBAND_SAMPLE_RATE
    x = np.sin(2 * np.pi * 60.0 * t) + 0.5 * np.sin(2 * np.pi * 180.0 * t)
    return _scale(x, dbfs)


def silence(ms: float) -> Signal:
    return np.zeros(_samples(ms))


def pcm(*parts: Signal) -> bytes:
    x = np.concatenate(parts)
    return np.clip(np.rint(x), -32768, 32767).astype("<i2").tobytes()


# ---- driver --------------------------------------------------------------------


@dataclass
class Run:
    """Frames fed on a virtual clock (frame i's audio ends at (i + 1) * 20 ms)."""

    endpointer: EnergyEndpointer = field(default_factory=EnergyEndpointer)
    frames: int = 0
    events: list[tuple[int, EndpointerEvent]] = field(default_factory=list)
    speech_frames: list[bool] = field(default_factory=list)
    levels: list[float] = field(default_factory=list)

    def feed(self, audio: bytes) -> Run:
        assert len(audio) % NARROWBAND_FRAME_BYTES == 0
        for start in range(0, len(audio), NARROWBAND_FRAME_BYTES):
            index = self.frames
            self.frames += 1
            out = self.endpointer.process(
                audio[start : start + NARROWBAND_FRAME_BYTES], (index + 1) * FRAME_MS
            )
            self.events.extend((index, event) for event in out)
            self.speech_frames.append(self.endpointer.frame_is_speech)
            self.levels.append(self.endpointer.level_dbfs)
        return self

    @property
    def started(self) -> list[tuple[int, SpeechStarted]]:
        return [(i, e) for i, e in self.events if isinstance(e, SpeechStarted)]

    @property
    def ended(self) -> list[tuple[int, TurnEnded]]:
        return [(i, e) for i, e in self.events if isinstance(e, TurnEnded)]

    def kinds(self) -> list[type]:
        return [type(e) for _, e in self.events]


def run(*parts: Signal, config: EndpointerConfig | None = None) -> Run:
    return Run(EnergyEndpointer(config)).feed(pcm(*parts))


def assert_alternates(events: Sequence[tuple[int, EndpointerEvent]]) -> None:
    for n, (_, event) in enumerate(events):
        assert isinstance(event, SpeechStarted if n % 2 == 0 else TurnEnded), events


# ---- the real speech fixture ---------------------------------------------------


def _fixture_8k() -> bytes:
    audio = read_wav_8k(FIXTURE)
    return audio[: len(audio) - len(audio) % NARROWBAND_FRAME_BYTES]


@pytest.fixture(scope="module")
def fixture_run() -> Run:
    """The 30 s recording, then 1 s of digital silence so the last turn ends."""
    return Run().feed(_fixture_8k() + pcm(silence(1000)))


def _turns(r: Run) -> list[tuple[float, float]]:
    """(onset, end) of each turn, in seconds."""
    return [
        (s.onset_ms / 1000, e.at_ms / 1000)
        for (_, s), (_, e) in zip(r.started, r.ended, strict=True)
    ]


def test_fixture_level_contour_is_what_the_expectations_assume(fixture_run: Run) -> None:
    # The recording (30 s, one talker, phone band; seen on a spectrogram):
    # opens with two frames of digital silence and 2.4 s of broadband noise
    # about as loud as the speech, has voiced speech peaking near -15 dBFS,
    # pauses between -40 and -57 dBFS, and exactly one pause of 500 ms or more
    # (23.5-24.1 s). The other expectations below rest on this.
    levels = np.array(fixture_run.levels[:1500])
    assert levels[:2].max() < -90  # digital silence
    assert -33 < np.median(levels[5:110]) < -26  # the opening noise
    assert levels.max() > -16
    assert -60 < levels[410:430].min() < -50  # the pause at 8.2-8.6 s
    # The long pause, 23.56-24.08 s: 26 frames within 10 dB of its own quietest.
    pause = levels[1178:1204]
    assert pause.max() < -44 and pause.max() - pause.min() < 10
    assert levels[1177] > -41 and levels[1204] > -41


def test_fixture_turns_are_plausible(fixture_run: Run) -> None:
    r = fixture_run
    assert_alternates(r.events)
    assert len(r.ended) == len(r.started)
    turns = _turns(r)
    # 5 with the defaults: the opening noise, then speech split at the noise
    # bursts of 18.3-19 s and 25.4-28.2 s and at the long pause. 1 would mean
    # the floor never adapts, 15 that word gaps end turns.
    assert 3 <= len(turns) <= 8, turns
    # The opening noise is a turn (energy cannot tell), but the floor adapts
    # to it: that turn ends within one noise window plus the trailing silence.
    first_onset, first_end = turns[0]
    assert first_onset < 0.1
    assert first_end < first_onset + (NOISE_WINDOW_MS + TRAILING_SILENCE_MS + 100) / 1000
    # The one long pause ends a turn...
    assert any(23.8 <= end <= 24.3 for _, end in turns), turns
    # ...and clearly voiced moments (harmonics on the spectrogram) are inside turns.
    for t in (2.7, 5.2, 9.8, 12.0, 14.2, 22.4, 24.9, 26.4, 28.4):
        assert any(onset <= t <= end for onset, end in turns), (t, turns)
    # The stretch of fluent speech from 9 to 14 s is never cut.
    assert not any(9.0 <= end <= 14.0 for _, end in turns), turns
    total_speech_s = sum(e.speech_ms for _, e in r.ended) / 1000
    assert 12.0 <= total_speech_s <= 26.0


def test_fixture_turn_ends_trailing_silence_after_the_last_speech(fixture_run: Run) -> None:
    r = fixture_run
    for index, event in r.ended:
        last_speech = max(i for i in range(index) if r.speech_frames[i])
        assert not any(r.speech_frames[last_speech + 1 : index + 1])
        assert event.at_ms - (last_speech + 1) * FRAME_MS == TRAILING_SILENCE_MS
    for index, started in r.started:
        assert r.speech_frames[index]
        assert MIN_SPEECH_MS <= started.at_ms - started.onset_ms <= ONSET_WINDOW_MS
        # onset_ms is the start of a speech frame.
        assert r.speech_frames[round(started.onset_ms / FRAME_MS)]
    speech_per_turn = [
        sum(r.speech_frames[round(s.onset_ms / FRAME_MS) : ei + 1]) * FRAME_MS
        for (_, s), (ei, _) in zip(r.started, r.ended, strict=True)
    ]
    assert speech_per_turn == [e.speech_ms for _, e in r.ended]


def test_fixture_is_deterministic(fixture_run: Run) -> None:
    again = Run().feed(_fixture_8k() + pcm(silence(1000)))
    assert again.events == fixture_run.events


def test_cost_per_frame_is_printed() -> None:
    # Not asserted (machine-dependent); printed for the record (pytest -s).
    frames = [pcm(voiced(20))] * 2000
    endpointer = EnergyEndpointer()
    start = time.perf_counter()
    for i, frame in enumerate(frames):
        endpointer.process(frame, i * FRAME_MS)
    per_frame_us = (time.perf_counter() - start) / len(frames) * 1e6
    print(f"endpointer: {per_frame_us:.1f} µs per 20 ms frame")


# ---- backgrounds that must never start a turn ----------------------------------


def test_digital_silence_gives_no_events() -> None:
    r = run(silence(3000))
    assert r.events == []
    assert not r.endpointer.in_speech
    assert r.endpointer.level_dbfs == DIGITAL_SILENCE_DBFS


@pytest.mark.parametrize("dbfs", [ABS_FLOOR_DBFS - 10, -30.0])
def test_white_noise_gives_no_turn(dbfs: float) -> None:
    # 10 dB below the absolute floor; -30: above it, but it is the background
    # from the first frame, so the noise floor sits on it.
    r = run(noise(4000, dbfs))
    assert r.events == []
    assert abs(r.endpointer.level_dbfs - dbfs) < 1.0
    assert r.endpointer.noise_floor_dbfs > dbfs - 2.0


def test_steady_hum_gives_no_turn() -> None:
    r = run(hum(4000, -35.0))
    assert r.events == []
    assert not any(r.speech_frames)
    assert -36.5 < r.endpointer.noise_floor_dbfs < -34.5
    # There from the first frame, the hum is the floor: the threshold sits a margin above it.
    assert r.endpointer.threshold_dbfs > -27.0


def test_hum_switching_on_mid_call_is_absorbed_within_a_noise_window() -> None:
    # A new steady noise looks like speech until it has filled a noise window:
    # at most one spurious turn, over by then, and nothing after.
    r = run(noise(1000), hum(6000, -35.0))
    assert len(r.events) <= 2
    assert_alternates(r.events)
    for _, ended in r.ended:
        assert ended.at_ms <= 1000 + NOISE_WINDOW_MS + TRAILING_SILENCE_MS + FRAME_MS
    assert not r.endpointer.in_speech
    assert not any(r.speech_frames[-100:])


@pytest.mark.parametrize("burst_ms", [20, 60, MIN_SPEECH_MS - FRAME_MS])
def test_clicks_and_short_bursts_give_no_turn(burst_ms: float) -> None:
    r = run(noise(1000), noise(burst_ms, -10.0, seed=1), noise(1000, seed=2))
    assert sum(r.speech_frames) == burst_ms // FRAME_MS
    assert r.events == []


def test_burst_of_min_speech_starts_a_turn() -> None:
    r = run(noise(1000), voiced(MIN_SPEECH_MS), noise(1000, seed=2))
    assert r.kinds() == [SpeechStarted, TurnEnded]


def test_voice_over_a_hum_is_still_a_turn() -> None:
    r = run(hum(2000, -40.0) + np.concatenate([silence(1000), voiced(1000)]), hum(1000, -40, 2000))
    assert r.kinds() == [SpeechStarted, TurnEnded]


# ---- exact timing on synthetic speech ------------------------------------------


def test_one_second_burst_gives_one_turn_at_the_exact_frames() -> None:
    lead_frames, burst_frames = 25, 50
    r = run(noise(lead_frames * FRAME_MS), voiced(burst_frames * FRAME_MS), noise(700, seed=1))
    assert r.speech_frames == [False] * lead_frames + [True] * burst_frames + [False] * 35

    started_at = lead_frames + MIN_SPEECH_FRAMES - 1  # frame 34: the 10th speech frame
    ended_at = lead_frames + burst_frames + TRAILING_FRAMES - 1  # frame 99: 25th silent frame
    assert r.events == [
        (started_at, SpeechStarted(at_ms=(started_at + 1) * FRAME_MS, onset_ms=500.0)),
        (ended_at, TurnEnded(at_ms=(ended_at + 1) * FRAME_MS, speech_ms=1000.0)),
    ]
    assert r.events[0][1] == SpeechStarted(at_ms=700.0, onset_ms=500.0)
    assert r.events[1][1] == TurnEnded(at_ms=2000.0, speech_ms=1000.0)
    assert not r.endpointer.in_speech


def test_in_speech_is_true_between_the_events() -> None:
    endpointer = EnergyEndpointer()
    audio = pcm(noise(500), voiced(1000), noise(700, seed=1))
    states = []
    for i in range(0, len(audio), NARROWBAND_FRAME_BYTES):
        endpointer.process(audio[i : i + NARROWBAND_FRAME_BYTES], 0.0)
        states.append(endpointer.in_speech)
    assert states == [False] * 34 + [True] * 65 + [False] * 11


def test_onset_is_when_the_confirming_speech_began() -> None:
    # 120 ms voiced, a 60 ms dip, 100 ms voiced: 11 speech frames within the
    # 15-frame onset window, so the turn starts, dated from the first frame.
    r = run(noise(400), voiced(120), silence(60), voiced(100), noise(800, seed=1))
    assert r.kinds() == [SpeechStarted, TurnEnded]
    index, started = r.started[0]
    assert started.onset_ms == 400.0
    assert index == 20 + 6 + 3 + 4 - 1  # the 10th speech frame
    assert r.ended[0][1].speech_ms == 220.0


def test_speech_spread_wider_than_the_onset_window_does_not_start() -> None:
    # 100 ms on, 120 ms off, repeated: never 10 speech frames within 15.
    parts = [noise(400)]
    for n in range(5):
        parts += [voiced(100), noise(120, seed=n + 1)]
    r = run(*parts, noise(500, seed=9))
    assert sum(r.speech_frames) == 25
    assert r.events == []


def test_gap_of_100_ms_inside_speech_keeps_one_turn() -> None:
    signal = voiced(2000)
    signal[_samples(960) : _samples(1060)] = 0.0  # five whole frames
    r = run(noise(500), signal, noise(700, seed=1))
    assert r.kinds() == [SpeechStarted, TurnEnded]
    assert r.ended[0][1] == TurnEnded(at_ms=500 + 2000 + TRAILING_SILENCE_MS, speech_ms=1900.0)


@pytest.mark.parametrize(
    ("gap_ms", "turns"),
    [(TRAILING_SILENCE_MS - FRAME_MS, 1), (TRAILING_SILENCE_MS, 2), (700, 2)],
)
def test_silence_of_trailing_length_splits_turns(gap_ms: float, turns: int) -> None:
    r = run(noise(500), voiced(800), noise(gap_ms, seed=1), voiced(800), noise(700, seed=2))
    assert r.kinds() == [SpeechStarted, TurnEnded] * turns
    assert [e.speech_ms for _, e in r.ended] == ([1600.0] if turns == 1 else [800.0, 800.0])
    if turns == 2:
        # The second turn's onset is the first frame after the gap.
        assert r.started[1][1].onset_ms == 500 + 800 + gap_ms


def test_config_durations_round_up_to_whole_frames() -> None:
    config = EndpointerConfig(min_speech_ms=90, onset_window_ms=100, trailing_silence_ms=210)
    r = run(noise(500), voiced(300), noise(500, seed=1), config=config)
    # 90 ms -> 5 frames, 210 ms -> 11 frames.
    assert r.events == [
        (29, SpeechStarted(at_ms=600.0, onset_ms=500.0)),
        (50, TurnEnded(at_ms=1020.0, speech_ms=300.0)),
    ]


# ---- bad input, reset, level ---------------------------------------------------


@pytest.mark.parametrize(
    "length", [0, 1, NARROWBAND_FRAME_BYTES - 1, NARROWBAND_FRAME_BYTES + 2, 1920]
)
def test_wrong_frame_length_is_a_value_error_and_changes_nothing(length: int) -> None:
    r = run(noise(500), voiced(100))
    before = (r.endpointer.level_dbfs, r.endpointer.noise_floor_dbfs, r.endpointer.in_speech)
    with pytest.raises(FrameLengthError) as info:
        r.endpointer.process(bytes(length), 1000.0)
    assert isinstance(info.value, ValueError)
    assert info.value.reason == "bad_frame_length"
    assert info.value.length == length
    assert str(NARROWBAND_FRAME_BYTES) in str(info.value)
    assert before == (
        r.endpointer.level_dbfs,
        r.endpointer.noise_floor_dbfs,
        r.endpointer.in_speech,
    )
    # The onset continues as if the bad frame had never come.
    r.feed(pcm(voiced(100), noise(700, seed=1)))
    assert r.kinds() == [SpeechStarted, TurnEnded]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_speech_ms": 0},
        {"trailing_silence_ms": -20},
        {"noise_window_ms": math.nan},
        {"onset_window_ms": math.inf},
        {"min_speech_ms": 300, "onset_window_ms": 200},
        {"margin_db": -1.0},
        {"abs_floor_dbfs": math.nan},
    ],
)
def test_bad_config_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        EndpointerConfig(**kwargs)


def test_reset_forgets_the_turn_and_the_floor() -> None:
    fresh = run(noise(500), voiced(1000), noise(700, seed=1))
    r = run(hum(2000, -30.0), voiced(300, -10.0))
    assert r.endpointer.in_speech
    r.endpointer.reset()
    assert not r.endpointer.in_speech
    assert r.endpointer.noise_floor_dbfs == DIGITAL_SILENCE_DBFS
    assert r.endpointer.level_dbfs == DIGITAL_SILENCE_DBFS
    again = Run(r.endpointer).feed(pcm(noise(500), voiced(1000), noise(700, seed=1)))
    assert again.events == fresh.events


def test_frame_level_dbfs() -> None:
    assert frame_level_dbfs(bytes(NARROWBAND_FRAME_BYTES)) == DIGITAL_SILENCE_DBFS
    assert frame_level_dbfs(b"") == DIGITAL_SILENCE_DBFS
    square = pcm(np.tile([32767.0, -32768.0], NARROWBAND_FRAME_SAMPLES // 2))
    assert frame_level_dbfs(square) == pytest.approx(0.0, abs=1e-3)
    t = np.arange(NARROWBAND_FRAME_SAMPLES) / NARROWBAND_SAMPLE_RATE
    sine = pcm(32767.0 * np.sin(2 * np.pi * 1000.0 * t))
    assert frame_level_dbfs(sine) == pytest.approx(-3.01, abs=0.01)
    assert frame_level_dbfs(pcm(_scale(np.sin(2 * np.pi * 1000.0 * t), -35.0))) == pytest.approx(
        -35.0, abs=0.01
    )


def test_frame_level_dbfs_asked_again_answers_the_same_and_follows_new_frames() -> None:
    loud = pcm(_scale(np.sin(np.arange(NARROWBAND_FRAME_SAMPLES) / 3.0), -12.0))
    quiet = pcm(_scale(np.sin(np.arange(NARROWBAND_FRAME_SAMPLES) / 3.0), -40.0))
    first = frame_level_dbfs(loud)
    assert frame_level_dbfs(loud) == first  # the same object: remembered
    assert frame_level_dbfs(bytes(loud)) == first  # an equal copy: measured again
    assert frame_level_dbfs(quiet) == pytest.approx(-40.0, abs=0.05)
    assert frame_level_dbfs(loud) == first
    # A mutable buffer is never taken from memory: its contents may have changed.
    buffer = bytearray(loud)
    assert frame_level_dbfs(buffer) == first  # type: ignore[arg-type]
    buffer[:] = quiet
    assert frame_level_dbfs(buffer) == pytest.approx(-40.0, abs=0.05)  # type: ignore[arg-type]
    samples = np.frombuffer(quiet, dtype="<i2").astype(np.float64)
    assert samples_level_dbfs(samples) == frame_level_dbfs(quiet)
    assert samples_level_dbfs(np.zeros(0)) == DIGITAL_SILENCE_DBFS
