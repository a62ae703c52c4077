"""The tool-trigger marker: a pure tone a test caller plays to make a scripted brain call a tool.

The mock OpenAI Realtime server and the example brains cannot understand speech,
so tests and the conformance kit need an in-band signal that survives the phone
path (24 kHz → 8 kHz μ-law → 24 kHz). A steady pure tone well inside the
telephone band does; speech almost never holds one frequency for long. This
module generates it and detects it (Goertzel, per 20 ms frame). No I/O.
"""

from __future__ import annotations

import math

import numpy as np

from rutster.media.formats import CANONICAL_FRAME_SAMPLES, CANONICAL_SAMPLE_RATE

#: Tone frequency. Inside the 300-3400 Hz telephone band (ITU-T G.711/G.712) so it
#: survives 8 kHz μ-law, and away from speech's strong low harmonics. Seed decision.
MARKER_TONE_HZ = 2_000.0
#: Tone length a caller plays. Seed decision: long enough to be unmistakable
#: (10 detection frames), short enough to hide inside a test turn.
MARKER_TONE_MS = 400
#: Tone level: 0.3 of full scale, about -10 dBFS, a normal speaking level on a phone line.
MARKER_TONE_AMPLITUDE = 0.3
#: Detection frame, 20 ms: the tap protocol's frame size.
DETECT_FRAME_SAMPLES = CANONICAL_FRAME_SAMPLES
#: Share of a frame's energy that must sit at the tone's frequency for the frame to
#: count. A clean tone scores ~1.0 (~0.9 after μ-law); speech scores well under 0.2.
DETECT_MIN_TONE_SHARE = 0.6
#: Frames in a row needed (200 ms): a chance harmonic in speech never holds this long.
DETECT_MIN_FRAMES = 10
#: Frames quieter than this RMS (s16 units, about -50 dBFS) are silence, never tone.
DETECT_MIN_RMS = 100.0


def marker_tone_pcm(ms: int = MARKER_TONE_MS, *, sample_rate: int = CANONICAL_SAMPLE_RATE) -> bytes:
    """The marker tone as PCM s16le mono, with 5 ms fades so it does not click."""
    n = sample_rate * ms // 1000
    t = np.arange(n, dtype=np.float64) / sample_rate
    wave = MARKER_TONE_AMPLITUDE * np.sin(2 * math.pi * MARKER_TONE_HZ * t)
    fade = min(n // 2, sample_rate * 5 // 1000)
    if fade:
        ramp = np.linspace(0.0, 1.0, fade)
        wave[:fade] *= ramp
        wave[n - fade :] *= ramp[::-1]
    return (wave * 32767).astype("<i2").tobytes()


def _tone_share(frame: np.ndarray, sample_rate: int) -> float:
    """Goertzel power at the marker frequency over the frame's total power (0..1)."""
    n = frame.size
    k = round(n * MARKER_TONE_HZ / sample_rate)
    coeff = 2.0 * math.cos(2.0 * math.pi * k / n)
    s_prev = s_prev2 = 0.0
    for x in frame.tolist():
        s = x + coeff * s_prev - s_prev2
        s_prev2, s_prev = s_prev, s
    power = s_prev2 * s_prev2 + s_prev * s_prev - coeff * s_prev * s_prev2
    total = float(np.dot(frame, frame)) * n / 2.0
    return 0.0 if total <= 0.0 else min(1.0, power / total)


class MarkerToneDetector:
    """Streaming detector: feed PCM s16le chunks, ask ``detected``.

    Keeps only a partial frame and a run counter, so it can watch an
    arbitrarily long stream in constant memory.
    """

    def __init__(self, sample_rate: int = CANONICAL_SAMPLE_RATE) -> None:
        self.sample_rate = sample_rate
        self._frame_samples = DETECT_FRAME_SAMPLES * sample_rate // CANONICAL_SAMPLE_RATE
        self._pending = b""
        self._run = 0
        self.detected = False

    def feed(self, pcm: bytes) -> bool:
        """Consume ``pcm``; return True once the tone has been heard (sticky until ``reset``)."""
        data = self._pending + pcm
        frame_bytes = self._frame_samples * 2
        whole = len(data) - len(data) % frame_bytes
        self._pending = data[whole:]
        if self.detected or whole == 0:
            return self.detected
        frames = np.frombuffer(data[:whole], dtype="<i2").astype(np.float64)
        for frame in frames.reshape(-1, self._frame_samples):
            rms = math.sqrt(float(np.dot(frame, frame)) / frame.size)
            if rms >= DETECT_MIN_RMS and _tone_share(frame, self.sample_rate) >= (
                DETECT_MIN_TONE_SHARE
            ):
                self._run += 1
                if self._run >= DETECT_MIN_FRAMES:
                    self.detected = True
                    break
            else:
                self._run = 0
        return self.detected

    def reset(self) -> None:
        """Forget everything heard so far (e.g. at the start of a new turn)."""
        self._pending = b""
        self._run = 0
        self.detected = False


def contains_marker_tone(pcm: bytes, sample_rate: int = CANONICAL_SAMPLE_RATE) -> bool:
    """Whether ``pcm`` (s16le mono) contains the marker tone anywhere."""
    return MarkerToneDetector(sample_rate).feed(pcm)
