"""Cost and accuracy of the voice-activity detectors side by side: ``python bench/vad_compare.py``.

Cost: µs per 20 ms narrowband frame (8 kHz, 160 samples; median of several
runs) over the 30 s 8 kHz speech fixture cut into frames by
:class:`~media.narrowband.NarrowbandTap` as calls hear it, straight off the
wire with no resampler (the caller talks, or there is noise, all the time),
over its speech stretches each followed by twice as long a quiet line ("talk
1/3", what a cascade sees on a call where the caller talks a third of the
time), and over a quiet line alone.

Accuracy: the fixture has no labels, so a labelled evaluation set is built
from it deterministically (fixed seeds, no randomness left):

* speech: six fluent stretches of the fixture (times below, picked by
  inspecting its level and spectrum frame by frame) and the nine utterances
  of ``espeak_speech_16k.wav``, placed over digital silence, over white,
  pink and hum backgrounds and over the fixture's own noise burst. Every
  frame of a stretch counts as speech, the short dips between its words
  included (as human labels do).
* non-speech: digital silence, white and pink noise at several levels, a
  clicking line, a mains hum, DTMF digits, a ringback tone and the fixture's
  broadband noise bursts (which are not speech).

Two streams: *phone* (built at 8 kHz: the Twilio path) and *wideband* (built
at 16 kHz with wideband noise: an L16 16 kHz leg). Each goes through a
:class:`~media.narrowband.NarrowbandTap` at its own rate, as a call's audio
does on its way to the detectors: the phone stream is only cut into 160-sample
frames, the wideband one is low-passed to the telephone band and decimated to
8 kHz first. A frame's label is the majority label of its samples, each
output sample taking the label of the nearest input sample (the decimation
filter's half-millisecond delay allowed for).

Reported per detector: speech-frame recall, non-speech false-positive rate
(overall and per kind of non-speech; for the backgrounds that speech is
laid over, much of it is the detector's release lag in the 500 ms of
background after the speech), onset delay (frames from a speech stretch's
first frame to its first frame at or above the threshold; a stretch with
none is a miss), the longest false alarm (run of false positives not
starting within RELEASE_FRAMES of speech: 200 ms of them start a turn in
media.endpointing), the share of frames a cascade ran its neural detector
on, and pairwise agreement on the raw fixture.

Usage: ``python bench/vad_compare.py [--runs N]`` (about 5 s).
"""

from __future__ import annotations

import argparse
import functools
import math
import platform
import statistics
import sys
import time
import wave
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import soxr

from rutster.media.formats import NARROWBAND_FRAME_SAMPLES, NARROWBAND_SAMPLE_RATE
from rutster.media.narrowband import NarrowbandTap, decimation_fir
from rutster.media.vad import (
    DEFAULT_SILERO_ENGINE,
    DETECTOR_NAMES,
    SPEECH_THRESHOLD,
    CascadeDetector,
    SileroDetector,
    SpeechDetector,
    make_detector,
)

FIXTURES = Path(__file__).resolve().parent.parent / "tests/fixtures/audio"
SPEECH_FIXTURE = FIXTURES / "caller_speech_8k.wav"
ESPEAK_FIXTURE = FIXTURES / "espeak_speech_16k.wav"

#: Fluent speech stretches of the fixture, (start s, end s): each starts where
#: the level rises out of a pause or a noise burst and ends at the last voiced
#: frame before the next long pause or burst (inspected frame by frame).
FIXTURE_SPEECH_S = (
    (2.50, 8.22),
    (8.64, 11.46),
    (11.72, 16.10),
    (21.12, 23.54),
    (24.08, 25.36),
    (28.26, 29.62),
)
#: The fixture's broadband noise bursts, (start s, end s), trimmed of their
#: edges and of a voiced blip at 26.2-26.6 s: not speech.
FIXTURE_NOISE_S = (
    (0.10, 2.30),
    (17.10, 17.70),
    (18.30, 18.90),
    (25.44, 26.10),
    (26.70, 28.10),
)
#: espeak utterances: runs of |sample| > ESPEAK_QUIET separated by at least
#: ESPEAK_SPLIT_S of quiet (the file has 1 s of digital silence between
#: utterances; "Hello? Is anybody there?" splits in two at its 330 ms pause).
ESPEAK_QUIET = 64
ESPEAK_SPLIT_S = 0.25

#: Frames after a speech stretch in which false positives count as the
#: detector's release lag, not as a false alarm (200 ms).
RELEASE_FRAMES = 10
#: Timed runs per cost figure; the median is reported.
DEFAULT_RUNS = 5
#: Seed of every generated noise (any fixed value: determinism is the point).
SEED = 20_240_601
#: Gap of digital silence between scenes, s.
GAP_S = 1.0
#: Non-speech background played before a speech stretch, so its onset is
#: measured against a detector that has settled on that background, s.
LEAD_S = 2.0


def read_wav(path: Path) -> tuple[npt.NDArray[np.float64], int]:
    """Mono 16-bit WAV samples as floats in PCM16 units, and the rate."""
    with wave.open(str(path), "rb") as wav:
        if (wav.getnchannels(), wav.getsampwidth()) != (1, 2):
            raise ValueError(f"{path} is not mono 16-bit")
        pcm = wav.readframes(wav.getnframes())
        return np.frombuffer(pcm, dtype="<i2").astype(np.float64), wav.getframerate()


def fixture_frames() -> list[bytes]:
    """The speech fixture as narrowband frames, as calls hear it (8 kHz: framing only)."""
    samples, rate = read_wav(SPEECH_FIXTURE)
    return NarrowbandTap(rate).push(samples.astype("<i2").tobytes())


def _tap_delay(rate: int) -> float:
    """Input samples by which NarrowbandTap(``rate``)'s output lags its input.

    0 at 8 kHz (framing only); at an integer multiple of 8 kHz, the linear-phase
    decimation filter's group delay (half its length). Other rates (soxr's
    streaming resampler in the tap) are not modelled: ValueError.
    """
    ratio, rest = divmod(rate, NARROWBAND_SAMPLE_RATE)
    if rest or not ratio:
        raise ValueError(f"no integer decimation from {rate} Hz to {NARROWBAND_SAMPLE_RATE} Hz")
    return 0.0 if ratio == 1 else (len(decimation_fir(ratio)) - 1) / 2


def espeak_utterances(rate: int) -> list[npt.NDArray[np.float64]]:
    """The espeak utterances (see ESPEAK_SPLIT_S), resampled to ``rate``."""
    samples, file_rate = read_wav(ESPEAK_FIXTURE)
    loud = np.flatnonzero(np.abs(samples) > ESPEAK_QUIET)
    breaks = np.flatnonzero(np.diff(loud) > ESPEAK_SPLIT_S * file_rate)
    starts = np.concatenate(([loud[0]], loud[breaks + 1]))
    ends = np.concatenate((loud[breaks], [loud[-1]])) + 1
    return [
        np.asarray(soxr.resample(samples[s:e], file_rate, rate, quality="HQ"), dtype=np.float64)
        if rate != file_rate
        else samples[s:e]
        for s, e in zip(starts, ends, strict=True)
    ]


def _dbfs_to_rms(dbfs: float) -> float:
    """RMS in PCM16 units of a level in dBFS (0 dBFS: full-scale square wave)."""
    return 32768.0 * math.pow(10.0, dbfs / 20.0)


def _at_level(x: npt.NDArray[np.float64], dbfs: float) -> npt.NDArray[np.float64]:
    """``x`` scaled to an RMS level of ``dbfs``."""
    scaled: npt.NDArray[np.float64] = x * (_dbfs_to_rms(dbfs) / float(np.sqrt(np.mean(x**2))))
    return scaled


@dataclass
class _Builder:
    """A stream under construction: samples, per-sample speech label and kind."""

    rate: int
    rng: np.random.Generator
    parts: list[npt.NDArray[np.float64]] = field(default_factory=list)
    speech: list[npt.NDArray[np.bool_]] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    kind_of_part: list[int] = field(default_factory=list)

    def seconds(self, s: float) -> int:
        return round(s * self.rate)

    def add(self, audio: npt.NDArray[np.float64], is_speech: bool, kind: str) -> None:
        if kind not in self.kinds:
            self.kinds.append(kind)
        self.parts.append(audio)
        self.speech.append(np.full(len(audio), is_speech))
        self.kind_of_part.append(self.kinds.index(kind))

    def silence(self, s: float = GAP_S) -> None:
        self.add(np.zeros(self.seconds(s)), False, "silence")

    # ---- noises ---------------------------------------------------------------

    def white(self, n: int, dbfs: float) -> npt.NDArray[np.float64]:
        return self.rng.standard_normal(n) * _dbfs_to_rms(dbfs)

    def pink(self, n: int, dbfs: float) -> npt.NDArray[np.float64]:
        spectrum = np.fft.rfft(self.rng.standard_normal(n))
        freqs = np.fft.rfftfreq(n, 1.0 / self.rate)
        spectrum[1:] /= np.sqrt(freqs[1:])
        spectrum[0] = 0.0
        return _at_level(np.fft.irfft(spectrum, n), dbfs)

    def hum(self, n: int, dbfs: float) -> npt.NDArray[np.float64]:
        # 60 Hz mains and its first harmonics, as a ground loop puts on a line.
        t = np.arange(n) / self.rate
        x = sum(
            a * np.sin(2 * np.pi * 60.0 * k * t + k)
            for k, a in enumerate((1.0, 0.6, 0.4, 0.25), start=1)
        )
        return _at_level(np.asarray(x, dtype=np.float64), dbfs)

    def dtmf(self, digits: str, dbfs: float) -> npt.NDArray[np.float64]:
        # ITU-T Q.23 frequency pairs; 100 ms on, 100 ms off per digit.
        rows, cols = (697.0, 770.0, 852.0, 941.0), (1209.0, 1336.0, 1477.0, 1633.0)
        keys = "123A456B789C*0#D"
        on = np.arange(self.seconds(0.1)) / self.rate
        out = []
        for d in digits:
            i = keys.index(d)
            tone = np.sin(2 * np.pi * rows[i // 4] * on) + np.sin(2 * np.pi * cols[i % 4] * on)
            out += [tone * _dbfs_to_rms(dbfs), np.zeros(self.seconds(0.1))]
        return np.concatenate(out)

    def ringback(self, n: int, dbfs: float) -> npt.NDArray[np.float64]:
        # North American ringback: 440 + 480 Hz (ANSI T1.401).
        t = np.arange(n) / self.rate
        x = np.sin(2 * np.pi * 440.0 * t) + np.sin(2 * np.pi * 480.0 * t)
        return x * _dbfs_to_rms(dbfs)

    def clicks(self, n: int, dbfs: float, every_s: float = 0.25) -> npt.NDArray[np.float64]:
        # Near-full-scale 2 ms decaying clicks on a quiet line.
        x = self.white(n, dbfs)
        click_len = self.seconds(0.002)
        click = (
            30_000.0
            * np.exp(-np.arange(click_len) / (click_len / 4))
            * np.cos(np.pi * np.arange(click_len))
        )
        for start in range(self.seconds(every_s) // 2, n - click_len, self.seconds(every_s)):
            x[start : start + click_len] += click
        return x

    # ---- scenes ---------------------------------------------------------------

    def noise_then_speech(
        self,
        speech: npt.NDArray[np.float64],
        noise: Callable[[int], npt.NDArray[np.float64]],
        kind: str,
        tail_s: float = 0.5,
    ) -> None:
        """LEAD_S of a background, speech over the same background, a tail of it."""
        lead, tail = self.seconds(LEAD_S), self.seconds(tail_s)
        bed = noise(lead + len(speech) + tail)
        self.add(bed[:lead], False, kind)
        self.add(bed[lead : lead + len(speech)] + speech, True, f"speech/{kind}")
        self.add(bed[lead + len(speech) :], False, kind)

    def frames(self) -> EvalStream:
        audio = np.concatenate(self.parts)
        speech = np.concatenate(self.speech)
        kind_index = np.concatenate(
            [np.full(len(p), k) for p, k in zip(self.parts, self.kind_of_part, strict=True)]
        )
        pcm = np.clip(np.rint(audio), -32768, 32767).astype("<i2").tobytes()
        # The way a call's audio at this rate reaches the detectors (media.narrowband).
        frames = NarrowbandTap(self.rate).push(pcm)
        # Labels follow the audio through the tap by nearest sample: output
        # sample j is centred on input sample j * ratio - delay.
        ratio = self.rate / NARROWBAND_SAMPLE_RATE
        n_frames = len(frames)
        size = n_frames * NARROWBAND_FRAME_SAMPLES
        src = np.clip(
            np.rint(np.arange(size) * ratio - _tap_delay(self.rate)).astype(np.int64),
            0,
            len(audio) - 1,
        )
        frame_speech = speech[src].reshape(n_frames, -1).mean(axis=1) > 0.5
        frame_kind = [
            self.kinds[int(np.bincount(row).argmax())]
            for row in kind_index[src].reshape(n_frames, -1)
        ]
        return EvalStream(frames, frame_speech, frame_kind)


@dataclass(frozen=True)
class EvalStream:
    """Narrowband frames with a speech label and a kind per frame."""

    frames: list[bytes]
    speech: npt.NDArray[np.bool_]
    kinds: list[str]


def phone_stream() -> EvalStream:
    """The labelled 8 kHz (phone) evaluation stream; see the module docstring."""
    samples, rate = read_wav(SPEECH_FIXTURE)
    b = _Builder(rate, np.random.default_rng(SEED))
    seg = [samples[round(s * rate) : round(e * rate)] for s, e in FIXTURE_SPEECH_S]
    utts = espeak_utterances(rate)

    b.silence()
    b.add(seg[0], True, "speech/silence")
    b.silence()
    for dbfs in (-60.0, -40.0, -20.0):
        b.add(b.white(b.seconds(3.0), dbfs), False, f"white {dbfs:.0f}")
        b.silence()
    for dbfs in (-45.0, -30.0):
        b.add(b.pink(b.seconds(3.0), dbfs), False, f"pink {dbfs:.0f}")
        b.silence()
    b.add(b.hum(b.seconds(3.0), -25.0), False, "hum -25")
    b.silence()
    b.add(b.dtmf("5551234#", -12.0), False, "dtmf")
    b.silence()
    b.add(b.ringback(b.seconds(2.0), -20.0), False, "ringback")
    b.silence()
    b.add(b.clicks(b.seconds(3.0), -60.0), False, "clicks")
    b.silence()
    for s, e in FIXTURE_NOISE_S:
        b.add(samples[round(s * rate) : round(e * rate)], False, "noise bursts")
        b.silence(0.5)
    b.silence()

    b.noise_then_speech(seg[1], lambda n: b.white(n, -40.0), "white -40")
    b.silence()
    b.noise_then_speech(seg[2], lambda n: b.pink(n, -35.0), "pink -35")
    b.silence()
    b.noise_then_speech(seg[3], lambda n: b.hum(n, -25.0), "hum -25")
    b.silence()
    burst = samples[round(FIXTURE_NOISE_S[0][0] * rate) : round(FIXTURE_NOISE_S[0][1] * rate)]
    b.noise_then_speech(seg[4], lambda n: np.resize(burst, n), "noise bursts")
    b.silence()
    b.add(seg[5], True, "speech/silence")
    b.silence()
    for i, utt in enumerate(utts):
        if i % 2:
            b.noise_then_speech(utt, lambda n: b.white(n, -50.0), "white -50")
        else:
            b.add(utt, True, "speech/silence")
        b.silence()
    return b.frames()


def wideband_stream() -> EvalStream:
    """The labelled 16 kHz (wideband) evaluation stream: espeak speech and wideband noise."""
    rate = 16_000
    b = _Builder(rate, np.random.default_rng(SEED + 1))
    utts = espeak_utterances(rate)
    b.silence()
    for dbfs in (-40.0, -25.0):
        b.add(b.white(b.seconds(3.0), dbfs), False, f"white {dbfs:.0f}")
        b.silence()
    b.add(b.pink(b.seconds(3.0), -30.0), False, "pink -30")
    b.silence()
    b.add(b.clicks(b.seconds(3.0), -60.0), False, "clicks")
    b.silence()
    b.add(b.dtmf("0123456789", -12.0), False, "dtmf")
    b.silence()
    backgrounds: list[tuple[str, Callable[[int], npt.NDArray[np.float64]]]] = [
        ("silence", lambda n: np.zeros(n)),
        ("white -45", lambda n: b.white(n, -45.0)),
        ("pink -40", lambda n: b.pink(n, -40.0)),
    ]
    for i, utt in enumerate(utts):
        kind, noise = backgrounds[i % len(backgrounds)]
        b.noise_then_speech(utt, noise, kind)
        b.silence()
    return b.frames()


# ---- scoring ----------------------------------------------------------------------


@dataclass(frozen=True)
class Score:
    """Accuracy of one detector on one stream."""

    recall: float
    false_positive: float
    onset_frames: list[int]
    missed: int
    fp_by_kind: dict[str, float]
    neural_share: float | None
    false_run: int


def probabilities(detector: SpeechDetector, frames: Sequence[bytes]) -> npt.NDArray[np.float64]:
    """The detector's probability for every frame, in order."""
    return np.array([detector.process(f) for f in frames])


def score(detector: SpeechDetector, threshold: float, stream: EvalStream) -> Score:
    """Recall, false positives and onset delays of ``detector`` on ``stream``."""
    active: list[bool] = []
    probs = []
    for f in stream.frames:
        probs.append(detector.process(f))
        if isinstance(detector, CascadeDetector):
            active.append(detector.active)
    hit = np.array(probs) >= threshold
    truth = stream.speech
    onsets = np.flatnonzero(truth & ~np.concatenate(([False], truth[:-1])))
    ends = np.flatnonzero(truth & ~np.concatenate((truth[1:], [False])))
    delays, missed = [], 0
    for s, e in zip(onsets, ends, strict=True):
        found = np.flatnonzero(hit[s : e + 1])
        if len(found):
            delays.append(int(found[0]))
        else:
            missed += 1
    kinds = np.array(stream.kinds)
    fp_by_kind = {
        k: float(hit[(kinds == k) & ~truth].mean())
        for k in dict.fromkeys(stream.kinds)
        if not k.startswith("speech/") and np.any((kinds == k) & ~truth)
    }
    # Longest run of false positives that does not start within
    # RELEASE_FRAMES of a speech stretch's end (there it is the detector's
    # release lag, not a false alarm). A run of 10 or more frames can start
    # a turn in media.endpointing (MIN_SPEECH_MS = 200).
    false_run, run = 0, 0
    for i in np.flatnonzero(hit & ~truth):
        run = run + 1 if i > 0 and hit[i - 1] and not truth[i - 1] else 1
        if run == 1 and truth[max(0, i - RELEASE_FRAMES) : i].any():
            run = -len(truth)  # belongs to a release tail: never counts
        false_run = max(false_run, run)
    return Score(
        recall=float(hit[truth].mean()),
        false_positive=float(hit[~truth].mean()),
        onset_frames=delays,
        missed=missed,
        fp_by_kind=fp_by_kind,
        neural_share=float(np.mean(active)) if active else None,
        false_run=false_run,
    )


def cost_us(factory: Callable[[], SpeechDetector], frames: Sequence[bytes], runs: int) -> float:
    """Median µs per frame of a fresh detector over ``frames``."""
    timings = []
    for _ in range(runs):
        detector = factory()
        process = detector.process
        start = time.perf_counter()
        for f in frames:
            process(f)
        timings.append((time.perf_counter() - start) / len(frames) * 1e6)
    return statistics.median(timings)


#: Length of the idle-line cost run: a quiet line (white noise at
#: IDLE_LINE_DBFS), what a cascade sees while the caller listens, s.
IDLE_LINE_S = 30.0
#: Level of the idle line: a quiet telephone line's noise.
IDLE_LINE_DBFS = -60.0


def idle_line_frames() -> list[bytes]:
    """IDLE_LINE_S of quiet white noise at 8 kHz as narrowband frames."""
    rng = np.random.default_rng(SEED + 2)
    n = round(IDLE_LINE_S * NARROWBAND_SAMPLE_RATE)
    pcm = np.rint(rng.standard_normal(n) * _dbfs_to_rms(IDLE_LINE_DBFS)).astype("<i2")
    return NarrowbandTap(NARROWBAND_SAMPLE_RATE).push(pcm.tobytes())


#: Listening time per second of talk in the conversation cost run: the caller
#: talks a third of the time (seed assumption for an agent call).
LISTEN_PER_TALK = 2.0


def conversation_frames() -> list[bytes]:
    """The fixture's speech stretches, each followed by twice its length of idle line."""
    samples, rate = read_wav(SPEECH_FIXTURE)
    b = _Builder(rate, np.random.default_rng(SEED + 3))
    for s, e in FIXTURE_SPEECH_S:
        seg = samples[round(s * rate) : round(e * rate)]
        b.add(seg, True, "speech")
        b.add(b.white(round(len(seg) * LISTEN_PER_TALK), IDLE_LINE_DBFS), False, "idle")
    return b.frames().frames


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _ms(frames: Sequence[int], pick: Callable[[Sequence[int]], float]) -> str:
    return f"{pick(frames) * 20:7.0f}ms" if frames else f"{'-':>9s}"


#: Width of the detector column (the longest label is "cascade (onnxruntime)").
LABEL_WIDTH = 21


def _rows() -> list[tuple[str, Callable[[], SpeechDetector]]]:
    """Each detector by name, then Silero and the cascade with Silero in onnxruntime when
    the default engine is the compiled kernel: the two engines side by side in one run."""
    rows: list[tuple[str, Callable[[], SpeechDetector]]] = [
        (name, functools.partial(make_detector, name)) for name in DETECTOR_NAMES
    ]
    if DEFAULT_SILERO_ENGINE != "onnxruntime":
        rows.append(("silero (onnxruntime)", lambda: SileroDetector("onnxruntime")))
        rows.append(
            (
                "cascade (onnxruntime)",
                lambda: CascadeDetector(confirm=SileroDetector("onnxruntime")),
            )
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Print the comparison tables."""
    parser = argparse.ArgumentParser(description="Cost and accuracy of the VADs side by side.")
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="timed runs per cost figure")
    args = parser.parse_args(argv)

    fixture = fixture_frames()
    idle = idle_line_frames()
    talk = conversation_frames()
    streams = {"phone": phone_stream(), "wideband": wideband_stream()}
    print(
        f"Python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}, "
        f"{_cpu_model()}; threshold {SPEECH_THRESHOLD}"
    )
    print(
        f"cost: fixture {len(fixture)} frames, idle line {len(idle)} frames "
        f"({IDLE_LINE_DBFS:.0f} dBFS white noise), talk 1/3: {len(talk)} frames (the "
        f"fixture's speech stretches, each then {LISTEN_PER_TALK:g}x as long idle)"
    )
    print(
        "accuracy: "
        + ", ".join(
            f"{n} stream {len(s.frames)} frames ({int(s.speech.sum())} speech)"
            for n, s in streams.items()
        )
    )
    print()
    print(
        f"{'':{LABEL_WIDTH}s} {'µs/frame':^29s} | {'phone stream (8 kHz)':^54s} | "
        f"{'wideband (16 kHz)':^25s}"
    )
    header = (
        f"{'detector':{LABEL_WIDTH}s} {'fixture':>9s} {'talk 1/3':>9s} {'idle':>9s} | "
        f"{'recall':>6s} {'FP':>6s} {'onset med':>9s} {'onset max':>9s} "
        f"{'missed':>6s} {'FP run':>6s} {'neural':>6s} | "
        f"{'recall':>6s} {'FP':>6s} {'onset med':>9s}"
    )
    print(header)
    print("-" * len(header))
    scores: dict[str, dict[str, Score]] = {}
    for name, factory in _rows():
        scores[name] = {k: score(factory(), SPEECH_THRESHOLD, s) for k, s in streams.items()}
        p, w = scores[name]["phone"], scores[name]["wideband"]
        share = "" if p.neural_share is None else f"{p.neural_share:6.0%}"
        print(
            f"{name:{LABEL_WIDTH}s} {cost_us(factory, fixture, args.runs):9.1f} "
            f"{cost_us(factory, talk, args.runs):9.1f} "
            f"{cost_us(factory, idle, args.runs):9.1f} | {p.recall:6.1%} "
            f"{p.false_positive:6.1%} {_ms(p.onset_frames, statistics.median)} "
            f"{_ms(p.onset_frames, max)} {p.missed:6d} {p.false_run * 20:4d}ms {share:>6s} | "
            f"{w.recall:6.1%} {w.false_positive:6.1%} {_ms(w.onset_frames, statistics.median)}"
        )
    print()
    print("recall: speech frames at/above the threshold; FP: non-speech frames at/above it;")
    print("onset: from a speech stretch's first frame to its first frame at/above the threshold;")
    print("missed: stretches never detected; FP run: longest false alarm (false positives")
    print(f"not within {RELEASE_FRAMES * 20} ms after speech; 200 ms can start a turn);")
    print("neural: share of frames the cascade ran Silero on; '(onnxruntime)': Silero run")
    print(
        f"in onnxruntime, beside the default engine ({DEFAULT_SILERO_ENGINE}) in the rows above it"
    )
    print()
    for stream_name in streams:
        kinds = list(scores[DETECTOR_NAMES[0]][stream_name].fp_by_kind)
        print(f"false positives by kind of non-speech, {stream_name} stream")
        print(f"{'detector':9s} " + " ".join(f"{k[:12]:>12s}" for k in kinds))
        for name in DETECTOR_NAMES:
            fp = scores[name][stream_name].fp_by_kind
            print(f"{name:9s} " + " ".join(f"{fp[k]:12.1%}" for k in kinds))
        print()

    decisions = {
        name: probabilities(make_detector(name), fixture) >= SPEECH_THRESHOLD
        for name in DETECTOR_NAMES
    }
    print("agreement on the raw fixture (share of frames decided alike; diagonal: share of speech)")
    print(f"{'':9s} " + " ".join(f"{n:>8s}" for n in DETECTOR_NAMES))
    for a in DETECTOR_NAMES:
        row = [
            float(decisions[a].mean()) if a == b else float((decisions[a] == decisions[b]).mean())
            for b in DETECTOR_NAMES
        ]
        print(f"{a:9s} " + " ".join(f"{v:8.1%}" for v in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
