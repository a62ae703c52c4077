"""Per-call, per-direction conversion between a leg's wire format and canonical PCM.

Inbound: wire payload -> PCM16 at the wire rate -> streaming resample to
24 kHz -> 480-sample canonical frames. Outbound: canonical PCM16 24 kHz ->
streaming resample to the wire rate -> wire encoding. Each instance holds the
resampler and framer state of one direction of one call. The resampler is the
default engine's (:func:`media.resample.stream_resampler`: a 2.6 ms polyphase
filter at 8 <-> 24 kHz, exactly 20 ms out for each 20 ms in).
"""

from __future__ import annotations

from rutster.media.formats import CANONICAL_FRAME_SAMPLES, CANONICAL_SAMPLE_RATE, MediaFormat
from rutster.media.framer import Framer
from rutster.media.g711 import decode, encode
from rutster.media.resample import (
    DEFAULT_ENGINE,
    ResamplerEngine,
    StreamResampler,
    stream_resampler,
)

__all__ = ["InboundTransform", "OutboundTransform", "UnsupportedFormatError"]


class UnsupportedFormatError(ValueError):
    """A wire format the media transform cannot convert (e.g. more than one channel)."""

    reason = "unsupported_media_format"


def _check_format(wire_format: MediaFormat) -> None:
    if wire_format.channels != 1:
        raise UnsupportedFormatError(f"only mono is supported, got {wire_format.channels} channels")
    if wire_format.sample_rate <= 0:
        raise UnsupportedFormatError(f"bad sample rate {wire_format.sample_rate}")


class InboundTransform:
    """Caller audio: wire payloads in, canonical 24 kHz 480-sample frames out."""

    __slots__ = ("_encoding", "_framer", "_resampler", "_wire_format")

    def __init__(
        self, wire_format: MediaFormat, *, engine: ResamplerEngine = DEFAULT_ENGINE
    ) -> None:
        _check_format(wire_format)
        self._wire_format = wire_format
        self._encoding = wire_format.encoding
        self._resampler = stream_resampler(wire_format.sample_rate, CANONICAL_SAMPLE_RATE, engine)
        self._framer = Framer(CANONICAL_FRAME_SAMPLES)

    @property
    def wire_format(self) -> MediaFormat:
        """The leg's inbound wire format."""
        return self._wire_format

    def process(self, payload: bytes) -> list[bytes]:
        """Convert one wire payload (any length); return the canonical frames it completes.

        An L16 payload of odd byte length raises
        :class:`~media.g711.PcmLengthError` (a ``ValueError``) and changes no state.
        """
        return self.frames(self.decode(payload))

    def decode(self, payload: bytes) -> bytes:
        """The wire payload as PCM16 s16le at the wire rate (no state; raises as ``process``)."""
        return decode(payload, self._encoding)

    def frames(self, pcm: bytes) -> list[bytes]:
        """Resample decoded wire PCM (:meth:`decode`); return the canonical frames it completes."""
        return self._framer.push(self._resampler.process(pcm))


#: Silent canonical frames fed through soxr's steady engine when it is created or
#: reset (only for a wire rate the polyphase filter does not take). It emits
#: nothing for the first 20 ms chunk and 15 ms for the second (measured, 24 kHz
#: -> 8 kHz); primed, every 20 ms frame the pacer releases leaves as exactly 20 ms
#: of wire audio, so the provider queue is never short of what the pacer believes
#: it sent. The polyphase filter needs none: it gives 20 ms for 20 ms from the
#: first frame.
OUTBOUND_PRIME_FRAMES = 2
_SILENT_FRAME = bytes(CANONICAL_FRAME_SAMPLES * 2)


class OutboundTransform:
    """Assistant audio: canonical 24 kHz PCM16 in, wire payloads out.

    What the resampler holds at the end of a response (the polyphase filter's
    2.6 ms) leaves with the next response's first frame, or is dropped by
    :meth:`reset` at a barge-in: nothing is ever sent that the pacer did not count.
    """

    __slots__ = ("_encoding", "_resampler", "_wire_format")

    def __init__(
        self, wire_format: MediaFormat, *, engine: ResamplerEngine = DEFAULT_ENGINE
    ) -> None:
        _check_format(wire_format)
        self._wire_format = wire_format
        self._encoding = wire_format.encoding
        self._resampler = stream_resampler(CANONICAL_SAMPLE_RATE, wire_format.sample_rate, engine)
        self._prime()

    def _prime(self) -> None:
        resampler = self._resampler
        if (
            isinstance(resampler, StreamResampler)
            and resampler.steady
            and not resampler.passthrough
        ):
            for _ in range(OUTBOUND_PRIME_FRAMES):
                resampler.process(_SILENT_FRAME)

    @property
    def wire_format(self) -> MediaFormat:
        """The leg's outbound wire format."""
        return self._wire_format

    def process(self, pcm: bytes) -> bytes:
        """Convert canonical s16le (any whole number of samples) to a wire payload.

        With the default engine the result is exactly the input's duration at
        the wire rate; soxr's block engine releases its output in bursts (see
        :mod:`media.resample`).
        """
        return self.encode(self.resample(pcm))

    def resample(self, pcm: bytes) -> bytes:
        """:meth:`process` up to the wire rate: PCM16 s16le, not yet encoded."""
        return self._resampler.process(pcm)

    def encode(self, pcm: bytes) -> bytes:
        """Wire-rate PCM16 (:meth:`resample`) in the wire encoding."""
        return encode(pcm, self._encoding)

    def flush(self) -> bytes:
        """End of the stream: the resampler's held-back tail, encoded; then ready for more."""
        tail = encode(self._resampler.flush(), self._encoding)
        self._prime()
        return tail

    def reset(self) -> None:
        """Barge-in: drop audio held in the resampler so none of it is ever sent."""
        self._resampler.reset()
        self._prime()
