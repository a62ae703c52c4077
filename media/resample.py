"""Streaming sample-rate conversion of PCM16 (s16le): the engines, and soxr's.

Calls resample through :func:`stream_resampler`, which picks the engine
(:class:`ResamplerEngine`): by default :class:`media.polyphase.PolyphaseResampler`
for the small-integer ratios telephony uses (8, 16, 48 kHz against the
canonical 24 kHz), soxr's steady engine for any other ratio. The rest of this
module is the soxr wrapper, :class:`StreamResampler`.

One :class:`StreamResampler` per call and direction keeps the filter state
across chunks, so the output of chunked input equals the one-shot resampling
of the whole signal and frame boundaries make no clicks.

Latency (measured with python-soxr 1.1 on AMD EPYC, 20 ms chunks, ``HQ``):
soxr filters in DFT blocks, so its output comes in bursts (about 60 ms at
8 kHz <-> 24 kHz) and a sample waits 13 to 73 ms (mean 44 ms) at 8 kHz <->
24 kHz, 6 to 37 ms (mean 22 ms) at 16 kHz <-> 24 kHz. ``MQ`` is the same,
``VHQ`` twice that, ``LQ`` half that but it loses 7.8 dB at 3.4 kHz on 8 kHz
audio. Callers that must not play stale audio after a barge-in call
:meth:`StreamResampler.reset`.

That burstiness breaks 20 ms pacing (three frames leave at once every 60 ms)
and adds up to 73 ms of latency each way, so calls use soxr's variable-rate
engine (``vr=True``) at a fixed ratio instead: measured here it emits exactly
one output chunk per input chunk after a one-chunk warm-up, with a constant
latency of 30 ms (8k -> 24k) and 25 ms (24k -> 8k), passband flat to 3.4 kHz
and over 110 dB of alias rejection at 4.5 kHz, for 9 µs (8k -> 24k) and 16 µs
(24k -> 8k) per 20 ms chunk instead of 3-5 µs. ``steady=False`` selects the
cheaper block engine (``bench/media_transform.py`` prints both). Measured
since on a slower VM: 17-24 µs and 28-30 µs, where the polyphase filter costs
8-15 µs and delays 2.6 ms (media/polyphase.py), hence the default engine.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

import numpy as np
import numpy.typing as npt
import soxr

from rutster.media.g711 import PcmLengthError
from rutster.media.polyphase import PolyphaseResampler, supports

__all__ = [
    "DEFAULT_ENGINE",
    "DEFAULT_QUALITY",
    "DEFAULT_STEADY",
    "Resampler",
    "ResamplerEngine",
    "StreamResampler",
    "stream_resampler",
]

#: soxr quality recipe, chosen by measurement (python-soxr 1.1, AMD EPYC, µs per
#: 20 ms chunk, int16 I/O): 8k->24k QQ 3.7, LQ 3.4,
#: MQ 3.4, HQ 3.5, VHQ 3.4; 24k->8k QQ 2.6, LQ 3.1, MQ 3.2, HQ 3.2, VHQ 3.2.
#: The cost is per-call overhead, flat across recipes, so quality and latency
#: decide: QQ has no anti-alias filter (a 5 kHz tone at 24 kHz aliases into
#: 8 kHz at 0 dB), LQ cuts the telephone band (-7.8 dB at 3.4 kHz), VHQ doubles
#: the latency (mean 86 ms at 8k <-> 24k); HQ is flat to 3.6 kHz, rejects that
#: alias by 82 dB and costs and delays the same as MQ.
DEFAULT_QUALITY = "HQ"

#: Sample type soxr works in. Not int16: libsoxr TPDF-dithers integer output
#: with a seed taken from the clock and a pointer, so int16 output differs by
#: ±1 LSB from run to run; float32 is what HQ computes in anyway, is
#: deterministic, and measured 5.0 µs vs 3.5 µs per 20 ms chunk with the
#: conversions below.
_SOXR_DTYPE = "float32"
_PCM16_MIN = np.float32(-32768.0)
_PCM16_MAX = np.float32(32767.0)
_EMPTY_FLOAT = np.zeros(0, dtype=np.float32)


def _to_pcm16(y: npt.NDArray[np.float32]) -> bytes:
    """Round and saturate soxr's float output to s16le bytes."""
    if not len(y):
        return b""
    np.rint(y, out=y)
    np.minimum(y, _PCM16_MAX, out=y)
    np.maximum(y, _PCM16_MIN, out=y)
    return y.astype(np.int16).tobytes()


#: Calls use the steady (variable-rate engine) mode by default; see the module docstring.
DEFAULT_STEADY = True


class StreamResampler:
    """Resample a continuous PCM16 s16le mono stream chunk by chunk.

    ``process`` takes any whole number of samples (including none) and returns
    whatever output soxr has ready; ``flush`` returns the filter tail at the
    end of a stream and makes the instance ready for a new one. Equal rates are
    a passthrough that never touches soxr.
    """

    __slots__ = ("_in_rate", "_out_rate", "_quality", "_steady", "_stream")

    def __init__(
        self,
        in_rate: int,
        out_rate: int,
        quality: str = DEFAULT_QUALITY,
        *,
        steady: bool = DEFAULT_STEADY,
    ) -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError(f"sample rates must be positive, got {in_rate} -> {out_rate}")
        self._in_rate = in_rate
        self._out_rate = out_rate
        self._quality = quality
        self._steady = steady
        # soxr validates the quality name itself (ValueError on an unknown one).
        self._stream: soxr.ResampleStream | None = (
            None
            if in_rate == out_rate
            else soxr.ResampleStream(
                in_rate, out_rate, 1, dtype=_SOXR_DTYPE, quality=quality, vr=steady
            )
        )

    @property
    def in_rate(self) -> int:
        """Input sample rate in Hz."""
        return self._in_rate

    @property
    def out_rate(self) -> int:
        """Output sample rate in Hz."""
        return self._out_rate

    @property
    def passthrough(self) -> bool:
        """Whether the rates are equal and audio passes through untouched."""
        return self._stream is None

    @property
    def steady(self) -> bool:
        """Whether soxr's variable-rate (steady) engine runs, not its block engine."""
        return self._steady

    def process(self, pcm: bytes) -> bytes:
        """Resample the next chunk of the stream; returns the output ready so far."""
        if len(pcm) & 1:
            raise PcmLengthError(len(pcm))
        stream = self._stream
        if stream is None:
            return pcm
        if not pcm:
            return b""
        return _to_pcm16(
            stream.resample_chunk(np.frombuffer(pcm, dtype=np.int16).astype(np.float32))
        )

    def flush(self) -> bytes:
        """End the stream: return the filter's remaining output, then reset."""
        stream = self._stream
        if stream is None:
            return b""
        tail = _to_pcm16(stream.resample_chunk(_EMPTY_FLOAT, last=True))
        stream.clear()
        return tail

    def reset(self) -> None:
        """Forget all stream state and pending output (for a new, unrelated stream)."""
        if self._stream is not None:
            self._stream.clear()


class Resampler(Protocol):
    """A streaming PCM16 s16le resampler, one per call and direction."""

    @property
    def in_rate(self) -> int:
        """Input sample rate in Hz."""

    @property
    def out_rate(self) -> int:
        """Output sample rate in Hz."""

    @property
    def passthrough(self) -> bool:
        """Whether audio passes through untouched (equal rates)."""

    def process(self, pcm: bytes) -> bytes:
        """Resample the next chunk; returns the output ready so far."""

    def flush(self) -> bytes:
        """End the stream: the filter's remaining output, then ready for a new one."""

    def reset(self) -> None:
        """Forget the stream (a barge-in's cut audio, a new stream)."""


class ResamplerEngine(StrEnum):
    """Which resampler a call's transforms use (``bench/media_transform.py`` prints each)."""

    #: media.polyphase for small-integer ratios (2.6 ms delay at 8 <-> 24 kHz,
    #: exactly 20 ms out per 20 ms in), soxr's steady engine for any other ratio.
    POLYPHASE = "polyphase"
    #: soxr's variable-rate engine at a fixed ratio (30 / 25 ms delay at 8 <-> 24 kHz).
    SOXR_STEADY = "soxr"
    #: soxr's block engine (the cheapest soxr: ~60 ms bursts, 13-73 ms delay).
    SOXR_BLOCK = "soxr-block"


#: The engine calls use: the polyphase filter, half soxr's cost and a tenth of its
#: delay on the rates telephony uses (media/polyphase.py, measured there).
DEFAULT_ENGINE = ResamplerEngine.POLYPHASE


def stream_resampler(
    in_rate: int, out_rate: int, engine: ResamplerEngine = DEFAULT_ENGINE
) -> Resampler:
    """A new streaming resampler for one direction of one call.

    Equal rates are a passthrough whatever the engine. Raises ``ValueError`` for
    a rate that is not positive.
    """
    if engine is ResamplerEngine.POLYPHASE and in_rate != out_rate and supports(in_rate, out_rate):
        return PolyphaseResampler(in_rate, out_rate)
    return StreamResampler(in_rate, out_rate, steady=engine is not ResamplerEngine.SOXR_BLOCK)
