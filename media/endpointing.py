"""Energy endpointer: when the caller starts a turn and when the turn is over.

The gateway owns turn-taking (docs/ARCHITECTURE.md, doctrine 1): it tells the
brain ``speech_started`` when the caller starts talking and
``speech_stopped`` when the caller has finished, and the brain then answers.
:class:`EnergyEndpointer` makes those two decisions from the narrowband
frames (20 ms, 160 samples of PCM16 at 8 kHz, media.narrowband) with nothing but frame
energy:

1. Each frame's level is its RMS in dBFS (0 dBFS is a full-scale square
   wave, so a full-scale sine is -3 dBFS).
2. A frame is *speech* when its level is at least
   ``max(abs_floor_dbfs, noise_floor + margin_db)``. The noise floor is the
   lowest frame level of the last ``noise_window_ms`` (minimum statistics):
   it follows the background down at once and up after one window, so a
   steady hum or line noise stops counting as speech within a window and,
   when it is there from the first frame, never counts at all. Speech keeps
   its floor low because it pauses between words far more often than once a
   window.
3. A turn starts (:class:`SpeechStarted`) once ``min_speech_ms`` of speech
   frames fall within ``onset_window_ms``, so a click or a cough shorter than
   that never starts one, and ends (:class:`TurnEnded`) after
   ``trailing_silence_ms`` of non-speech frames in a row, so the dips inside
   and between words do not end it.

Durations are counted in audio (frames x 20 ms), not read from ``now_ms``, so
frames that arrive in bursts do not distort them; ``now_ms`` (any monotonic
origin) only stamps the events and is taken to be the time at the *end* of
the frame's audio. Nothing here does I/O or reads a clock.

Limits, by design: energy cannot tell speech from equally loud non-stationary
noise (a door, a passing car, the noise bursts in the test fixture), and a
sound held steady for a whole noise window (a long "ummm") is taken for
background. A neural VAD is a later work item.

Cost (measured on the 30 s speech fixture, Python 3.11, numpy 2.4, AMD EPYC):
2.0 µs per frame, 1.3 µs of it the level, i.e. 0.01 % of one core per call at
50 frames/s.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from rutster.media.formats import (
    FRAME_MS,
    NARROWBAND_FRAME_BYTES,
    NARROWBAND_FRAME_SAMPLES,
    ms_to_frames,
)

__all__ = [
    "ABS_FLOOR_DBFS",
    "DIGITAL_SILENCE_DBFS",
    "MARGIN_DB",
    "MIN_SPEECH_MS",
    "NOISE_WINDOW_MS",
    "ONSET_WINDOW_MS",
    "TRAILING_SILENCE_MS",
    "EndpointerConfig",
    "EndpointerEvent",
    "EnergyEndpointer",
    "FrameLengthError",
    "SpeechStarted",
    "TurnEnded",
    "frame_level_dbfs",
    "samples_level_dbfs",
]

#: Quietest level a frame can be speech at, whatever the background (seed
#: decision): a telephone talker measures about -20 dBFS on the fixture's
#: voiced frames and its pauses -40 to -55 dBFS; -45 keeps idle-channel and
#: comfort noise out when the background is too quiet to give a useful floor.
ABS_FLOOR_DBFS = -45.0
#: How far above the background a frame must be to be speech (seed decision):
#: 10 dB clears the frame-to-frame wobble of steady noise (well under 1 dB for
#: white noise, a few dB for real line noise) and is below the 15-25 dB that
#: voiced speech rises above the fixture's pauses.
MARGIN_DB = 10.0
#: Window the noise floor is the minimum over (seed decision): the ~1.5 s
#: minimum-statistics window of Martin (IEEE Trans. Speech Audio Process.
#: 9(5), 2001), long enough to span a stretch of speech without a pause,
#: short enough to adapt to a new noise within a breath.
NOISE_WINDOW_MS = 1500
#: Speech needed to start a turn (seed decision from the brief): 10 frames,
#: longer than a click or a cough, shorter than a one-syllable "yes".
MIN_SPEECH_MS = 200
#: Span that MIN_SPEECH_MS of speech must fall within (seed decision): leaves
#: room for a 100 ms dip inside the first syllable.
ONSET_WINDOW_MS = 300
#: Non-speech that ends a turn (seed decision from the project design): the
#: default ``silence_duration_ms`` of OpenAI Realtime's ``server_vad``.
TRAILING_SILENCE_MS = 500
#: Level reported for an all-zero frame (whose true level is -inf): just above
#: the 16-bit quantisation noise, 20*log10((1/sqrt(12))/32768) = -101.1 dBFS.
DIGITAL_SILENCE_DBFS = -100.0

#: Full-scale amplitude of PCM16, the 0 dBFS reference.
_FULL_SCALE = 32768.0
#: Mean power of a frame at DIGITAL_SILENCE_DBFS, in LSB^2.
_SILENCE_POWER = _FULL_SCALE**2 * 10.0 ** (DIGITAL_SILENCE_DBFS / 10.0)
_PCM16_LE = np.dtype("<i2")


class FrameLengthError(ValueError):
    """A frame that is not one narrowband frame long.

    ``reason`` is a short, stable label for metrics and logs.
    """

    reason = "bad_frame_length"

    def __init__(self, length: int) -> None:
        super().__init__(
            f"frame of {length} bytes; need exactly {NARROWBAND_FRAME_BYTES} "
            f"({NARROWBAND_FRAME_SAMPLES} samples, {FRAME_MS} ms of 8 kHz PCM16 s16le mono)"
        )
        self.length = length


def samples_level_dbfs(samples: npt.NDArray[np.float64]) -> float:
    """RMS level in dBFS of PCM16 sample values (as floats); see :func:`frame_level_dbfs`."""
    if not len(samples):
        return DIGITAL_SILENCE_DBFS
    power = float(np.dot(samples, samples)) / len(samples)
    if power <= _SILENCE_POWER:
        return DIGITAL_SILENCE_DBFS
    return 10.0 * math.log10(power) - 20.0 * math.log10(_FULL_SCALE)


#: The last frame :func:`frame_level_dbfs` measured, and its level. The engine asks
#: for the same caller frame's level twice (the echo gate, then the VAD's energy
#: gate, which hear the same bytes object unless the gate cleaned the frame); held
#: here, the second answer costs an identity check, not ~2 µs of numpy. Holding
#: the reference keeps the object alive, so ``is`` can never match a new frame.
_last_level: tuple[bytes, float] = (b"", DIGITAL_SILENCE_DBFS)


def frame_level_dbfs(frame: bytes) -> float:
    """RMS level of a PCM16 s16le frame in dBFS (0 dBFS: full-scale square wave).

    An all-zero (or empty) frame reports :data:`DIGITAL_SILENCE_DBFS`, as does
    anything quieter.
    """
    global _last_level
    last = _last_level
    if frame is last[0] and type(frame) is bytes:  # immutable: the same object, the same level
        return last[1]
    level = samples_level_dbfs(np.frombuffer(frame, dtype=_PCM16_LE).astype(np.float64))
    _last_level = (frame, level)
    return level


@dataclass(frozen=True, slots=True)
class EndpointerConfig:
    """Tuning of an :class:`EnergyEndpointer`; durations round up to whole 20 ms frames."""

    min_speech_ms: float = MIN_SPEECH_MS
    onset_window_ms: float = ONSET_WINDOW_MS
    trailing_silence_ms: float = TRAILING_SILENCE_MS
    abs_floor_dbfs: float = ABS_FLOOR_DBFS
    margin_db: float = MARGIN_DB
    noise_window_ms: float = NOISE_WINDOW_MS

    def __post_init__(self) -> None:
        durations = {
            "min_speech_ms": self.min_speech_ms,
            "onset_window_ms": self.onset_window_ms,
            "trailing_silence_ms": self.trailing_silence_ms,
            "noise_window_ms": self.noise_window_ms,
        }
        for name, value in durations.items():
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of ms, got {value!r}")
        if ms_to_frames(self.onset_window_ms) < ms_to_frames(self.min_speech_ms):
            raise ValueError(
                f"onset_window_ms ({self.onset_window_ms}) must be at least "
                f"min_speech_ms ({self.min_speech_ms})"
            )
        if not (math.isfinite(self.abs_floor_dbfs) and math.isfinite(self.margin_db)):
            raise ValueError("abs_floor_dbfs and margin_db must be finite")
        if self.margin_db < 0:
            raise ValueError(f"margin_db must not be negative, got {self.margin_db}")


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    """The caller started a turn.

    ``at_ms`` is the end of the frame that confirmed it; ``onset_ms`` is the
    start of the first speech frame of the confirming window, i.e. when the
    caller started talking (``at_ms - onset_ms`` is the detection delay).
    """

    at_ms: float
    onset_ms: float


@dataclass(frozen=True, slots=True)
class TurnEnded:
    """The caller finished the turn.

    ``at_ms`` is the end of the frame that completed the trailing silence;
    ``speech_ms`` is the speech heard in the turn (speech frames x 20 ms,
    the confirming ones included, dips and trailing silence not).
    """

    at_ms: float
    speech_ms: float


#: What :meth:`EnergyEndpointer.process` reports.
EndpointerEvent = SpeechStarted | TurnEnded


class EnergyEndpointer:
    """Turn starts and ends of one call's inbound audio, from frame energy.

    Feed every narrowband frame, in order, to :meth:`process`; it returns the
    events that frame caused (at most one). Deterministic: the same frames
    give the same events.
    """

    __slots__ = (
        "_abs_floor",
        "_config",
        "_floor_window",
        "_frame_index",
        "_frame_is_speech",
        "_in_speech",
        "_level",
        "_margin",
        "_min_speech_frames",
        "_noise_floor",
        "_noise_window_frames",
        "_onset",
        "_onset_speech",
        "_silent_frames",
        "_speech_frames",
        "_trailing_frames",
    )

    def __init__(self, config: EndpointerConfig | None = None) -> None:
        self._config = config = config if config is not None else EndpointerConfig()
        self._abs_floor = config.abs_floor_dbfs
        self._margin = config.margin_db
        self._min_speech_frames = ms_to_frames(config.min_speech_ms)
        self._trailing_frames = ms_to_frames(config.trailing_silence_ms)
        self._noise_window_frames = ms_to_frames(config.noise_window_ms)
        # Decisions of the last onset_window frames while no turn is open.
        self._onset: deque[bool] = deque(maxlen=ms_to_frames(config.onset_window_ms))
        # (frame index, level), levels strictly increasing: the front is the
        # minimum of the window (the classic monotonic-deque sliding minimum,
        # O(1) amortised per frame).
        self._floor_window: deque[tuple[int, float]] = deque()
        self._init_state()

    def _init_state(self) -> None:
        self._onset.clear()
        self._floor_window.clear()
        self._onset_speech = 0
        self._frame_index = 0
        self._level = DIGITAL_SILENCE_DBFS
        self._noise_floor = DIGITAL_SILENCE_DBFS
        self._frame_is_speech = False
        self._in_speech = False
        self._silent_frames = 0
        self._speech_frames = 0

    # ---- read-only state -----------------------------------------------------

    @property
    def config(self) -> EndpointerConfig:
        """The tuning this endpointer runs with."""
        return self._config

    @property
    def in_speech(self) -> bool:
        """Whether a turn is open (after :class:`SpeechStarted`, before :class:`TurnEnded`)."""
        return self._in_speech

    @property
    def level_dbfs(self) -> float:
        """Level of the last frame, in dBFS."""
        return self._level

    @property
    def noise_floor_dbfs(self) -> float:
        """Background level the last frame was judged against, in dBFS."""
        return self._noise_floor

    @property
    def threshold_dbfs(self) -> float:
        """Level a frame had to reach to count as speech at the last frame."""
        return max(self._abs_floor, self._noise_floor + self._margin)

    @property
    def frame_is_speech(self) -> bool:
        """Whether the last frame was classified as speech."""
        return self._frame_is_speech

    # ---- operations ----------------------------------------------------------

    def process(self, frame: bytes, now_ms: float) -> list[EndpointerEvent]:
        """Take the next narrowband frame, whose audio ends at ``now_ms``; return its events.

        Raises :class:`FrameLengthError` (a ``ValueError``) unless ``frame`` is
        exactly one narrowband frame; the state is then unchanged.
        """
        if len(frame) != NARROWBAND_FRAME_BYTES:
            raise FrameLengthError(len(frame))
        level = self._level = frame_level_dbfs(frame)
        index = self._frame_index
        self._frame_index = index + 1

        window = self._floor_window
        while window and window[-1][1] >= level:
            window.pop()
        window.append((index, level))
        if window[0][0] <= index - self._noise_window_frames:
            window.popleft()
        floor = self._noise_floor = window[0][1]
        speech = self._frame_is_speech = level >= max(self._abs_floor, floor + self._margin)

        if self._in_speech:
            if speech:
                self._silent_frames = 0
                self._speech_frames += 1
                return []
            self._silent_frames += 1
            if self._silent_frames < self._trailing_frames:
                return []
            self._in_speech = False
            self._onset.clear()
            self._onset_speech = 0
            return [TurnEnded(at_ms=now_ms, speech_ms=float(self._speech_frames * FRAME_MS))]

        onset = self._onset
        if len(onset) == onset.maxlen and onset[0]:
            self._onset_speech -= 1
        onset.append(speech)
        if speech:
            self._onset_speech += 1
        if self._onset_speech < self._min_speech_frames:
            return []
        first = onset.index(True)
        self._in_speech = True
        self._silent_frames = 0
        self._speech_frames = self._onset_speech
        return [SpeechStarted(at_ms=now_ms, onset_ms=now_ms - (len(onset) - first) * FRAME_MS)]

    def reset(self) -> None:
        """Forget everything heard, noise floor included (as newly constructed)."""
        self._init_state()
