"""Reply audio for the MOCK OpenAI Realtime server: speech-like, never real speech.

The mock server (:mod:`tools.realtime_mock_server`) is offline and cannot talk,
but what it sends back must behave like a voice on the phone path: voiced,
band-limited, with a moving pitch, changing vowels and a syllable rhythm, so
that VAD, echo, level and barge-in logic downstream see something close to a
person and not a test tone. :func:`synthesize_reply` makes that with a classic
source-filter model: a glottal pulse train at a drifting pitch drives parallel
formant resonators whose vowel changes every syllable, under a syllable-rate
envelope whose dips never reach digital silence. It is deterministic (seeded),
vectorised numpy (the pulses' formant responses overlap-added), and avoids the tool-trigger
marker tone (:mod:`tools.marker_tone`).

:func:`load_reply_wav` instead loads a real recording (any rate, mono 16-bit
WAV) resampled to 24 kHz with soxr, for a mock that replies with real speech.

Output of both: PCM s16le mono at 24 kHz (``media.formats.CANONICAL_SAMPLE_RATE``).
No I/O except :func:`load_reply_wav` reading its file.
"""

from __future__ import annotations

import math
import wave
from pathlib import Path

import numpy as np
import numpy.typing as npt
import soxr

from rutster.media.formats import CANONICAL_SAMPLE_RATE, SAMPLE_WIDTH

__all__ = [
    "MAX_REPLY_MS",
    "MockVoiceError",
    "ReplyWavError",
    "load_reply_wav",
    "synthesize_reply",
]

#: Output sample rate: OpenAI Realtime's ``audio/pcm`` rate (docs/PROVIDERS.md §5.2).
SAMPLE_RATE = CANONICAL_SAMPLE_RATE
#: Longest reply either function returns, 10 minutes (seed decision: bounds memory
#: at ~29 MB of PCM; no mock reply needs to be longer).
MAX_REPLY_MS = 600_000

#: Syllable length range. Conversational English runs at about 4-5 syllables per
#: second (Pellegrino et al. 2011, "A cross-language perspective on speech
#: information rate"), i.e. 200-250 ms; a little spread either side.
SYLLABLE_MS_MIN = 180
SYLLABLE_MS_MAX = 260
#: Share of each syllable at the end that is the inter-syllable dip (~45 ms).
SYLLABLE_GAP_SHARE = 0.2
#: Envelope floor in the dips, relative to the syllable peak (-16.5 dB): speech
#: dips between syllables but a talker's voice never drops to digital zero.
ENVELOPE_FLOOR = 0.15
#: Cross-fade between one syllable's vowel and the next (a formant transition).
VOWEL_CROSSFADE_MS = 30

#: Pitch range of the mock voice: an adult voice between a low male and a
#: typical female fundamental (Titze, "Principles of Voice Production").
PITCH_MIN_HZ = 100.0
PITCH_MAX_HZ = 220.0
#: Centre and two slow sinusoidal intonation components of the pitch contour
#: (seed decision: spans the range above, moves within every syllable).
PITCH_CENTRE_HZ = 160.0
PITCH_SLOW_DEPTH_HZ = 42.0
PITCH_SLOW_RATE_HZ = 0.45
PITCH_FAST_DEPTH_HZ = 16.0
PITCH_FAST_RATE_HZ = 1.9

#: First three formants (Hz) of five vowels, Peterson & Barney (1952) adult male
#: averages for the vowels of "father", "bed", "beat", "bought", "boot". The F2s
#: nearest the 2 kHz marker tone ("bed" 1840 Hz, "beat" 2290 Hz) stay clear of it.
VOWEL_FORMANTS_HZ: tuple[tuple[float, float, float], ...] = (
    (730.0, 1090.0, 2440.0),
    (530.0, 1840.0, 2480.0),
    (270.0, 2290.0, 3010.0),
    (570.0, 840.0, 2410.0),
    (300.0, 870.0, 2240.0),
)
#: Formant bandwidths (Hz), typical of vowels (Klatt 1980 synthesiser defaults ~60-150).
FORMANT_BANDWIDTHS_HZ = (80.0, 100.0, 150.0)
#: Parallel-branch gains: about -6 dB per formant, the natural spectral tilt of
#: voiced speech (glottal -12 dB/oct plus lip radiation +6 dB/oct).
FORMANT_GAINS = (1.0, 0.5, 0.25)
#: Length of each vowel's impulse response; the narrowest formant (80 Hz) has
#: decayed by > 60 dB after 30 ms.
FORMANT_IR_MS = 30
#: Breath noise mixed under the voice, relative to the peak (about -34 dB).
BREATH_NOISE_LEVEL = 0.02
#: Peak level of the output: -6 dBFS, a loud but unclipped talker.
PEAK_LEVEL = 0.5

_PCM16_FULL_SCALE = 32767.0


class MockVoiceError(ValueError):
    """A reply that cannot be synthesised. ``reason`` is a short, stable label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ReplyWavError(ValueError):
    """A reply WAV that cannot be used. ``reason`` is a short, stable label:
    ``unreadable``, ``not_wav``, ``not_mono``, ``not_16bit``, ``empty``, ``too_long``.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _syllable_bounds(n: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """Start sample of each syllable plus ``n`` at the end (random lengths, seeded)."""
    mean_samples = SAMPLE_RATE * (SYLLABLE_MS_MIN + SYLLABLE_MS_MAX) / 2000
    count = int(n / mean_samples) + 2
    lengths = rng.integers(
        SAMPLE_RATE * SYLLABLE_MS_MIN // 1000, SAMPLE_RATE * SYLLABLE_MS_MAX // 1000, count
    )
    while int(lengths.sum()) < n:  # only if every draw came out short
        lengths = np.concatenate([lengths, lengths])
    starts = np.concatenate([[0], np.cumsum(lengths)])
    starts = starts[starts < n]
    return np.concatenate([starts, [n]]).astype(np.int64)


def _vowel_sequence(count: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """One vowel per syllable, never the same twice in a row (so formants always move)."""
    steps = rng.integers(1, len(VOWEL_FORMANTS_HZ), count)
    first = int(rng.integers(0, len(VOWEL_FORMANTS_HZ)))
    return np.asarray((first + np.cumsum(steps) - steps[0]) % len(VOWEL_FORMANTS_HZ), np.int64)


def _formant_impulse_responses() -> npt.NDArray[np.float64]:
    """Impulse response (vowels x samples) of each vowel's parallel formant resonators."""
    t = np.arange(SAMPLE_RATE * FORMANT_IR_MS // 1000) / SAMPLE_RATE
    responses = np.zeros((len(VOWEL_FORMANTS_HZ), t.size))
    for v, formants in enumerate(VOWEL_FORMANTS_HZ):
        for freq, bandwidth, gain in zip(
            formants, FORMANT_BANDWIDTHS_HZ, FORMANT_GAINS, strict=True
        ):
            # Impulse response of a two-pole resonator: a decaying sinusoid.
            responses[v] += gain * np.exp(-math.pi * bandwidth * t) * np.sin(2 * math.pi * freq * t)
    return responses


_IMPULSE_RESPONSES = _formant_impulse_responses()


def synthesize_reply(duration_ms: int, *, seed: int = 0) -> bytes:
    """A voiced, speech-like mock reply of ``duration_ms``: PCM s16le mono 24 kHz.

    Deterministic for a given ``seed``. Raises :class:`MockVoiceError`
    (``reason="bad_duration"``) unless ``0 < duration_ms <= MAX_REPLY_MS``.
    """
    if not 0 < duration_ms <= MAX_REPLY_MS:
        raise MockVoiceError(
            "bad_duration", f"reply duration must be 1..{MAX_REPLY_MS} ms, got {duration_ms}"
        )
    rng = np.random.default_rng(seed)
    n = SAMPLE_RATE * duration_ms // 1000
    t = np.arange(n) / SAMPLE_RATE

    # Source: one glottal pulse per pitch period, the pitch drifting slowly.
    phase0, phase1 = rng.uniform(0.0, 2 * math.pi, 2)
    f0 = (
        PITCH_CENTRE_HZ
        + PITCH_SLOW_DEPTH_HZ * np.sin(2 * math.pi * PITCH_SLOW_RATE_HZ * t + phase0)
        + PITCH_FAST_DEPTH_HZ * np.sin(2 * math.pi * PITCH_FAST_RATE_HZ * t + phase1)
    )
    np.clip(f0, PITCH_MIN_HZ, PITCH_MAX_HZ, out=f0)
    cycles = np.floor(np.cumsum(f0) / SAMPLE_RATE)
    pulse_at = np.flatnonzero(np.diff(cycles, prepend=-1.0))  # where each period starts

    # Per syllable: its vowel (cross-faded in from the previous one) and envelope.
    bounds = _syllable_bounds(n, rng)
    vowels = _vowel_sequence(bounds.size - 1, rng)
    syllable = np.searchsorted(bounds, np.arange(n), side="right") - 1
    start = bounds[syllable]
    length = bounds[syllable + 1] - start
    pos = np.arange(n) - start

    # Filter: the pulses are sparse (one per period), so overlap-adding each
    # pulse's formant impulse response is far cheaper than convolving the signal.
    fade = np.clip(pos[pulse_at] / (SAMPLE_RATE * VOWEL_CROSSFADE_MS / 1000), 0.0, 1.0)
    current = vowels[syllable[pulse_at]]
    previous = vowels[np.maximum(syllable[pulse_at] - 1, 0)]
    responses = (
        fade[:, np.newaxis] * _IMPULSE_RESPONSES[current]
        + (1.0 - fade)[:, np.newaxis] * _IMPULSE_RESPONSES[previous]
    )
    at = pulse_at[:, np.newaxis] + np.arange(_IMPULSE_RESPONSES.shape[1])
    summed = np.bincount(at.ravel(), weights=responses.ravel(), minlength=n + at.shape[1])
    signal: npt.NDArray[np.float64] = summed[:n].astype(np.float64)

    voiced_share = np.minimum(pos / (length * (1.0 - SYLLABLE_GAP_SHARE)), 1.0)
    envelope = ENVELOPE_FLOOR + (1.0 - ENVELOPE_FLOOR) * np.sin(math.pi * voiced_share)
    signal *= envelope
    peak = float(np.max(np.abs(signal))) or 1.0
    signal *= 1.0 / peak
    signal += BREATH_NOISE_LEVEL * envelope * rng.standard_normal(n)
    signal *= PEAK_LEVEL / max(1.0, float(np.max(np.abs(signal))))
    return bytes(np.rint(signal * _PCM16_FULL_SCALE).astype("<i2").tobytes())


def load_reply_wav(path: str | Path) -> bytes:
    """A real-speech reply: a mono 16-bit WAV at any rate, as PCM s16le mono 24 kHz.

    Raises :class:`ReplyWavError` for a file that cannot be read or is not
    mono 16-bit PCM, is empty, or is longer than :data:`MAX_REPLY_MS`.
    """
    try:
        with wave.open(str(path), "rb") as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            frames = wav.getnframes()
            if channels != 1:
                raise ReplyWavError("not_mono", f"{path}: need mono, got {channels} channels")
            if width != SAMPLE_WIDTH:
                raise ReplyWavError("not_16bit", f"{path}: need 16-bit PCM, got {8 * width}-bit")
            if frames == 0:
                raise ReplyWavError("empty", f"{path}: no audio")
            if frames * 1000 > MAX_REPLY_MS * rate:
                raise ReplyWavError("too_long", f"{path}: longer than {MAX_REPLY_MS} ms")
            pcm = wav.readframes(frames)
    except wave.Error as exc:
        raise ReplyWavError("not_wav", f"{path}: not a PCM WAV file ({exc})") from exc
    except (OSError, EOFError) as exc:
        raise ReplyWavError("unreadable", f"{path}: cannot read ({exc})") from exc
    samples = np.frombuffer(pcm, dtype="<i2")
    if rate == SAMPLE_RATE:
        return samples.tobytes()
    # float32, not int16: libsoxr dithers integer output with a clock-derived
    # seed (see media/resample.py), float output is deterministic.
    resampled = soxr.resample(samples.astype(np.float32), rate, SAMPLE_RATE, quality="HQ")
    return bytes(np.clip(np.rint(resampled), -32768, 32767).astype("<i2").tobytes())
