"""G.711 μ-law/A-law and L16 codecs between wire payloads and PCM16 (s16le).

The G.711 work is done by the stdlib C module ``audioop`` (Python 3.11 and 3.12;
the ``audioop-lts`` wheel supplies the same module on Python >= 3.13), which
converts a whole 20 ms payload in well under a microsecond.

``audioop`` works in the host's native byte order while every PCM buffer in
rutster is little-endian, so this module refuses to import on a big-endian
host rather than silently producing byte-swapped noise.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable

from rutster.media.formats import SAMPLE_WIDTH, Encoding

with warnings.catch_warnings():
    # audioop is deprecated in 3.11/3.12 (PEP 594); audioop-lts keeps it alive on >= 3.13.
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

if sys.byteorder != "little":  # pragma: no cover - no big-endian CI host
    raise ImportError(
        "media.g711 supports little-endian hosts only: audioop works in native byte order "
        "and rutster's PCM is s16le"
    )

__all__ = [
    "PcmLengthError",
    "alaw_decode",
    "alaw_encode",
    "decode",
    "encode",
    "l16_decode",
    "l16_encode",
    "ulaw_decode",
    "ulaw_encode",
]


class PcmLengthError(ValueError):
    """A PCM16 buffer whose byte length is not a whole number of samples.

    ``reason`` is a short, stable label for metrics and logs.
    """

    reason = "odd_pcm_length"

    def __init__(self, length: int) -> None:
        super().__init__(f"PCM16 buffer of {length} bytes is not a whole number of samples")
        self.length = length


def _check_pcm(pcm: bytes) -> None:
    if len(pcm) & 1:
        raise PcmLengthError(len(pcm))


def ulaw_decode(data: bytes) -> bytes:
    """Decode G.711 μ-law (1 byte per sample) to PCM16 s16le."""
    return audioop.ulaw2lin(data, SAMPLE_WIDTH)


def ulaw_encode(pcm: bytes) -> bytes:
    """Encode PCM16 s16le to G.711 μ-law; raises :class:`PcmLengthError` on an odd length."""
    _check_pcm(pcm)
    return audioop.lin2ulaw(pcm, SAMPLE_WIDTH)


def alaw_decode(data: bytes) -> bytes:
    """Decode G.711 A-law (1 byte per sample) to PCM16 s16le."""
    return audioop.alaw2lin(data, SAMPLE_WIDTH)


def alaw_encode(pcm: bytes) -> bytes:
    """Encode PCM16 s16le to G.711 A-law; raises :class:`PcmLengthError` on an odd length."""
    _check_pcm(pcm)
    return audioop.lin2alaw(pcm, SAMPLE_WIDTH)


def l16_decode(data: bytes) -> bytes:
    """Pass L16 (s16le) wire audio through; raises :class:`PcmLengthError` on an odd length."""
    _check_pcm(data)
    return data


def l16_encode(pcm: bytes) -> bytes:
    """Pass PCM16 s16le through as L16; raises :class:`PcmLengthError` on an odd length."""
    _check_pcm(pcm)
    return pcm


_DECODERS: dict[Encoding, Callable[[bytes], bytes]] = {
    Encoding.MULAW: ulaw_decode,
    Encoding.ALAW: alaw_decode,
    Encoding.L16: l16_decode,
}
_ENCODERS: dict[Encoding, Callable[[bytes], bytes]] = {
    Encoding.MULAW: ulaw_encode,
    Encoding.ALAW: alaw_encode,
    Encoding.L16: l16_encode,
}


def decode(payload: bytes, encoding: Encoding) -> bytes:
    """Decode a wire payload in ``encoding`` to PCM16 s16le (same sample rate)."""
    return _DECODERS[encoding](payload)


def encode(pcm: bytes, encoding: Encoding) -> bytes:
    """Encode PCM16 s16le to a wire payload in ``encoding`` (same sample rate)."""
    return _ENCODERS[encoding](pcm)
