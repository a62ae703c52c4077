"""The reflex loop's view of a call: the wire's audio as 20 ms frames of 8 kHz telephone band.

The brain hears the caller at the canonical 24 kHz, through the call's
resampler (:mod:`media.resample`: the polyphase filter by default, which holds
2.6 ms each way at 8 <-> 24 kHz; soxr's steady engine, 30 ms in and 25 ms out,
where the ratio is not a small integer). The reflex loop (VAD, echo gate,
barge-in) has no use for either rate change: what the caller's line carries
is the telephone band, and what the assistant's echo can hold is what was put
on the wire. So the engine taps both directions on the wire side of the
resamplers:

- caller audio as decoded from the wire, before it is resampled up;
- assistant audio as it goes onto the wire, after it is resampled down.

Measured on the reflex rig (``bench/reflex.py``, tune split), when calls
resampled with soxr's steady engine: the inbound tap alone moved every
barge-in 30 ms earlier, that resampler's whole latency. The tap also spares
the reflex loop the resamplers' filters, whichever engine runs.

:class:`NarrowbandTap` turns PCM16 at the wire's rate, in chunks of any
length, into :data:`~media.formats.NARROWBAND_FRAME_BYTES` frames of s16le at
8 kHz. At 8 kHz (G.711: Twilio, most SIP trunks) that is framing only. At an
integer multiple of 8 kHz (16 kHz L16 on SIP legs, 24 or 48 kHz) it is a
short linear-phase low-pass (:data:`DECIMATION_CUTOFF_HZ`, a Hamming-windowed
sinc of :data:`DECIMATION_TAPS_PER_RATIO` taps per 8 kHz of ratio) and every
k-th sample: under a millisecond of delay, written here because soxr's
streaming engine would add its own 25 ms back. Other rates go through soxr.
Sans-I/O and deterministic.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from rutster.media.formats import NARROWBAND_FRAME_SAMPLES, NARROWBAND_SAMPLE_RATE
from rutster.media.framer import Framer
from rutster.media.g711 import PcmLengthError
from rutster.media.resample import StreamResampler

__all__ = [
    "DECIMATION_CUTOFF_HZ",
    "DECIMATION_TAPS_PER_RATIO",
    "NarrowbandTap",
    "decimation_fir",
]

#: Upper edge of the telephone band (ITU-T G.712: 300-3400 Hz): all of a
#: narrowband line's audio, and all the echo it can carry back.
DECIMATION_CUTOFF_HZ = 3_400.0
#: Low-pass taps per unit of decimation ratio, plus one (31 at 24 kHz, 21 at 16
#: kHz): at 24 kHz -16 dB at 4 kHz and under -50 dB from 5 kHz, the filter the
#: echo gate's render reference used before this tap (measured then: the line
#: canceller's ERLE on echo alone 30.7 -> 33.6 dB against a three-sample mean).
DECIMATION_TAPS_PER_RATIO = 10


def decimation_fir(ratio: int) -> npt.NDArray[np.float64]:
    """The low-pass taken before keeping every ``ratio``-th sample (unit DC gain)."""
    taps = DECIMATION_TAPS_PER_RATIO * ratio + 1
    n = np.arange(taps) - (taps - 1) / 2
    cutoff = DECIMATION_CUTOFF_HZ / (NARROWBAND_SAMPLE_RATE * ratio)
    h: npt.NDArray[np.float64] = 2 * cutoff * np.sinc(2 * cutoff * n) * np.hamming(taps)
    normalised: npt.NDArray[np.float64] = h / h.sum()
    return normalised


class _Decimator:
    """Integer-ratio decimation to 8 kHz with a short FIR; state spans chunks."""

    __slots__ = ("_fir", "_history", "_ratio")

    def __init__(self, ratio: int) -> None:
        self._ratio = ratio
        self._fir = decimation_fir(ratio)
        self._history: npt.NDArray[np.float64] = np.zeros(len(self._fir) - 1)

    def reset(self) -> None:
        self._history = np.zeros(len(self._fir) - 1)

    def __call__(self, pcm: bytes) -> bytes:
        taps, ratio = len(self._fir), self._ratio
        x = np.concatenate((self._history, np.frombuffer(pcm, dtype="<i2")))
        count = (len(x) - taps) // ratio + 1 if len(x) >= taps else 0
        if count <= 0:
            self._history = x
            return b""
        step = x.strides[0]
        # Output j is the filter over x[j*ratio : j*ratio + taps]: one row per output.
        rows = np.lib.stride_tricks.as_strided(
            x, (count, taps), (ratio * step, step), writeable=False
        )
        y = rows @ self._fir
        self._history = x[count * ratio :].copy()
        return np.clip(np.rint(y), -32768, 32767).astype("<i2").tobytes()


class NarrowbandTap:
    """PCM16 s16le at ``wire_rate``, any chunk length, in; 20 ms 8 kHz frames out."""

    __slots__ = ("_decimator", "_framer", "_resampler", "_wire_rate")

    def __init__(self, wire_rate: int) -> None:
        if wire_rate <= 0:
            raise ValueError(f"bad sample rate {wire_rate}")
        self._wire_rate = wire_rate
        self._framer = Framer(NARROWBAND_FRAME_SAMPLES)
        ratio, rest = divmod(wire_rate, NARROWBAND_SAMPLE_RATE)
        self._decimator = _Decimator(ratio) if ratio > 1 and not rest else None
        self._resampler = (
            StreamResampler(wire_rate, NARROWBAND_SAMPLE_RATE) if rest or not ratio else None
        )

    @property
    def wire_rate(self) -> int:
        """The rate of the PCM pushed in."""
        return self._wire_rate

    def push(self, pcm: bytes) -> list[bytes]:
        """Take the next chunk of wire PCM; return the narrowband frames it completes.

        Raises :class:`~media.g711.PcmLengthError` (a ``ValueError``) on an odd
        byte count, with no state changed.
        """
        if len(pcm) & 1:
            raise PcmLengthError(len(pcm))
        if self._decimator is not None:
            pcm = self._decimator(pcm)
        elif self._resampler is not None:
            pcm = self._resampler.process(pcm)
        return self._framer.push(pcm)

    def reset(self) -> None:
        """Forget the filter history and any partial frame (a new, unrelated stream)."""
        self._framer.reset()
        if self._decimator is not None:
            self._decimator.reset()
        if self._resampler is not None:
            self._resampler.reset()
