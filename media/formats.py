"""Canonical audio format and the media formats calls arrive in.

The canonical format is fixed by the architecture doctrine (docs/ARCHITECTURE.md,
"Canonical audio") and by the tap protocol v1: PCM signed 16-bit little-endian,
mono, 24 kHz, 20 ms frames of 480 samples. The *narrowband* frame (8 kHz, 160
samples) is what the reflex loop hears of each direction, taken on the wire side
of the resamplers so that it waits for neither (media.narrowband).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

#: Canonical sample rate: OpenAI Realtime's ``audio/pcm`` rate, tap protocol v1.
CANONICAL_SAMPLE_RATE = 24_000
#: Frame duration: the telephony packetisation interval (RFC 3551 default ptime).
FRAME_MS = 20
#: Bytes per PCM16 sample.
SAMPLE_WIDTH = 2
#: Samples in one canonical 20 ms frame (24,000 * 0.020).
CANONICAL_FRAME_SAMPLES = CANONICAL_SAMPLE_RATE * FRAME_MS // 1000
#: Bytes in one canonical frame.
CANONICAL_FRAME_BYTES = CANONICAL_FRAME_SAMPLES * SAMPLE_WIDTH
#: What the reflex loop (VAD, echo gate) hears of a call: the telephone band
#: (ITU-T G.712, 300-3400 Hz) at 8 kHz, the rate of G.711 and of the narrowest
#: line, taken from the wire before any resampling (media.narrowband).
NARROWBAND_SAMPLE_RATE = 8_000
#: Samples in one 20 ms narrowband frame.
NARROWBAND_FRAME_SAMPLES = NARROWBAND_SAMPLE_RATE * FRAME_MS // 1000
#: Bytes in one narrowband frame (PCM16 s16le mono).
NARROWBAND_FRAME_BYTES = NARROWBAND_FRAME_SAMPLES * SAMPLE_WIDTH


class Encoding(StrEnum):
    """Wire encodings a call leg may use."""

    MULAW = "mulaw"  # G.711 μ-law, 1 byte per sample
    ALAW = "alaw"  # G.711 A-law, 1 byte per sample
    L16 = "l16"  # linear PCM16, little-endian (s16le)


@dataclass(frozen=True, slots=True)
class MediaFormat:
    """The audio format of one direction of a call leg as it is on the wire."""

    encoding: Encoding
    sample_rate: int
    channels: int = 1

    @property
    def bytes_per_sample(self) -> int:
        """Bytes one sample takes on the wire."""
        return SAMPLE_WIDTH if self.encoding is Encoding.L16 else 1

    def duration_ms(self, payload_bytes: int) -> float:
        """How long ``payload_bytes`` of this format plays, in milliseconds."""
        samples = payload_bytes // self.bytes_per_sample // self.channels
        return samples * 1000.0 / self.sample_rate


#: Twilio Media Streams: always μ-law 8 kHz mono (docs/PROVIDERS.md §1.3).
TWILIO_MULAW_8K = MediaFormat(Encoding.MULAW, 8_000)


def samples_to_ms(samples: int, sample_rate: int = CANONICAL_SAMPLE_RATE) -> int:
    """Whole milliseconds that ``samples`` last at ``sample_rate`` (rounded down)."""
    return samples * 1000 // sample_rate


def ms_to_frames(ms: float) -> int:
    """Whole 20 ms frames that cover ``ms`` (rounded up; 0 for 0)."""
    return math.ceil(ms / FRAME_MS)
