"""Streaming rational-ratio resampling of PCM16 with a short linear-phase FIR.

The rates calls use are small-integer ratios of the canonical 24 kHz: 8 kHz
(G.711: Twilio, most SIP trunks) is 1:3, 16 kHz (L16 and G.722 legs) 2:3,
48 kHz 2:1. For them :class:`PolyphaseResampler` runs one Kaiser-windowed
low-pass as a polyphase filter: per chunk, one matrix product of the input's
sliding windows with the filter's phases. Written here because neither
library on hand does this job well (measured on a 2-core AMD EPYC VM, numpy
2.4, python-soxr 1.1, 20 ms chunks):

- soxr's streaming engines cost 17 µs (8 -> 24 kHz) and 28 µs (24 -> 8 kHz)
  a chunk in its steady variable-rate mode, and hold 30 and 25 ms of audio;
  its block mode is cheaper but emits ~60 ms bursts (``media/resample.py``).
  Its filters are far steeper than a phone line needs.
- scipy's ``upfirdn`` keeps no state between chunks.

This filter's passband reaches :data:`PASSBAND_FRACTION` of the lower rate's
Nyquist frequency (3.5 kHz at 8 kHz: all of the G.712 telephone band, 300-3400
Hz; 7 kHz at 16 kHz: all of G.722's 50-7000 Hz), images and aliases beyond
:data:`STOPBAND_FRACTION` of it are :data:`STOPBAND_ATTENUATION_DB` down, and
it delays the audio by half its length, rounded up to a whole number of
samples at both rates: 2.625 ms at 8 <-> 24 kHz, 1.375 ms at 16 <-> 24 kHz
(``delay_ms``). Every chunk gives exactly the output its input is
worth (a chunk that is not a whole number of ratio periods keeps its last
under-a-period samples for the next), so 20 ms in is 20 ms out from the first
chunk on. Sans-I/O and deterministic (no dither). The product runs in the compiled
kernel ``polyphase_pcm16`` (``media/_kernels.c``) where it was built, summing in double,
and in numpy's float32 matrix product otherwise: the two outputs are within one PCM step
of each other (``tests/test_media_polyphase.py``).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from rutster.media.compiled import KERNELS
from rutster.media.g711 import PcmLengthError

__all__ = [
    "MAX_FACTOR",
    "PASSBAND_FRACTION",
    "STOPBAND_ATTENUATION_DB",
    "STOPBAND_FRACTION",
    "PolyphaseResampler",
    "kaiser_lowpass",
    "supports",
]

#: Largest interpolation or decimation factor, once the ratio is reduced, this
#: resampler takes (8, 12, 16, 24, 32 and 48 kHz against 24 kHz all reduce to
#: factors of 3 or less); other ratios (44.1 kHz: 147:160) go to soxr.
MAX_FACTOR = 6
#: Passband edge, as a fraction of the lower rate's Nyquist frequency: 3.5 kHz
#: for 8 kHz audio (ITU-T G.712's telephone band ends at 3.4 kHz), 7 kHz for 16
#: kHz (ITU-T G.722's band ends at 7 kHz).
PASSBAND_FRACTION = 0.875
#: Stopband edge, as that fraction: 4.5 kHz for 8 kHz audio. What lies between
#: the two edges (3.5-4.5 kHz at 8 kHz) is where a G.711 line has next to
#: nothing (its own filters roll off from 3.4 kHz).
STOPBAND_FRACTION = 1.125
#: Stopband attenuation the filter is designed for: images and aliases 80 dB
#: down sit under G.711 mu-law's own quantisation noise (~38 dB SNR).
STOPBAND_ATTENUATION_DB = 80.0

_PCM16_MIN = np.float32(-32768.0)
_PCM16_MAX = np.float32(32767.0)


def supports(in_rate: int, out_rate: int) -> bool:
    """Whether :class:`PolyphaseResampler` takes this pair of rates."""
    if in_rate <= 0 or out_rate <= 0:
        return False
    g = math.gcd(in_rate, out_rate)
    return in_rate // g <= MAX_FACTOR and out_rate // g <= MAX_FACTOR


def kaiser_lowpass(
    rate: int, passband_hz: float, stopband_hz: float, attenuation_db: float, delay_step: int = 1
) -> npt.NDArray[np.float64]:
    """A linear-phase low-pass FIR at ``rate`` (odd length, unit DC gain).

    Its delay, half its length less one, is rounded up to a multiple of
    ``delay_step`` samples.

    Kaiser's window design (J. F. Kaiser, "Nonrecursive digital filter design
    using the I0-sinh window function", 1974; the formulas as in Oppenheim and
    Schafer, *Discrete-Time Signal Processing*, 3rd ed., eqs. 7.62-7.63): the
    window's beta from the attenuation, the length from the attenuation and
    the transition width, the cut-off midway between the edges.
    """
    if not 0 < passband_hz < stopband_hz < rate / 2:
        raise ValueError(f"bad band edges {passband_hz}/{stopband_hz} Hz at {rate} Hz")
    a = attenuation_db
    if a > 50:
        beta = 0.1102 * (a - 8.7)
    elif a >= 21:
        beta = 0.5842 * (a - 21) ** 0.4 + 0.07886 * (a - 21)
    else:
        beta = 0.0
    width = 2 * math.pi * (stopband_hz - passband_hz) / rate
    delay = math.ceil((a - 8) / (2.285 * width) / 2)
    delay = -(-delay // delay_step) * delay_step
    taps = 2 * delay + 1
    cutoff = (passband_hz + stopband_hz) / 2 / rate
    n = np.arange(taps) - (taps - 1) / 2
    h: npt.NDArray[np.float64] = 2 * cutoff * np.sinc(2 * cutoff * n) * np.kaiser(taps, beta)
    unit: npt.NDArray[np.float64] = h / h.sum()
    return unit


class PolyphaseResampler:
    """Resample a continuous PCM16 s16le mono stream by a small rational ratio.

    The same interface as :class:`media.resample.StreamResampler`:
    ``process`` takes any whole number of samples and returns the output they
    complete; ``flush`` returns the filter's tail and starts a new stream;
    ``reset`` forgets the stream. Raises ``ValueError`` for rates it does not
    take (:func:`supports`).
    """

    __slots__ = (
        "_buffer",
        "_coefficients",
        "_delay_ms",
        "_down",
        "_in_rate",
        "_keep",
        "_out_rate",
        "_pending",
        "_steady_in",
        "_steady_view",
        "_up",
        "_width",
        "compiled",
    )

    def __init__(self, in_rate: int, out_rate: int) -> None:
        if not supports(in_rate, out_rate):
            raise ValueError(
                f"no polyphase filter for {in_rate} -> {out_rate} Hz "
                f"(factors above {MAX_FACTOR} once reduced)"
            )
        g = math.gcd(in_rate, out_rate)
        up, down = out_rate // g, in_rate // g
        self._in_rate, self._out_rate = in_rate, out_rate
        self._up, self._down = up, down
        nyquist = min(in_rate, out_rate) / 2
        h = kaiser_lowpass(
            in_rate * up,
            PASSBAND_FRACTION * nyquist,
            STOPBAND_FRACTION * nyquist,
            STOPBAND_ATTENUATION_DB,
            # A whole number of samples late at both rates: no fractional delay.
            delay_step=up * down,
        )
        self._delay_ms = (len(h) - 1) / 2 / (in_rate * up) * 1000
        # Each phase of the interpolator sums every up-th tap: gain `up` keeps each
        # phase's DC gain at one.
        per_phase = -(-len(h) // up)
        padded = np.zeros(per_phase * up)
        padded[: len(h)] = h * up
        # One period of the ratio: `down` inputs give `up` outputs. Output r of a
        # period starting at input q*down is the phase (r*down) % up of the filter
        # over the inputs up to q*down + (r*down)//up, newest first. Window column
        # j of a period holds input q*down - (per_phase - 1) + j.
        offsets = [r * down // up for r in range(up)]
        width = per_phase + offsets[-1]
        coefficients = np.zeros((width, up), np.float32)
        for r, offset in enumerate(offsets):
            phase = padded[(r * down) % up :: up]  # phase[t] weighs input anchor - t
            for t in range(per_phase):
                coefficients[offset + per_phase - 1 - t, r] = phase[t]
        self._coefficients = coefficients
        self._width = width
        #: Whether the compiled product runs (tests set it False for numpy's).
        self.compiled = KERNELS is not None
        # The last per_phase - 1 inputs, which the next period's windows reach back
        # to, live at the head of the buffer.
        self._keep = per_phase - 1
        self._pending = b""
        # The steady case, one 20 ms chunk, works in a fixed buffer through a
        # window view made once (making a strided view costs more than the product).
        steady_in = in_rate // 50
        self._steady_in = steady_in if steady_in % down == 0 else 0
        self._buffer: npt.NDArray[np.float32] = np.zeros(per_phase - 1 + steady_in, np.float32)
        self._steady_view = np.lib.stride_tricks.as_strided(
            self._buffer,
            (steady_in // down, width),
            (down * self._buffer.itemsize, self._buffer.itemsize),
            writeable=False,
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
        """Never: equal rates are :class:`media.resample.StreamResampler`'s passthrough."""
        return False

    @property
    def delay_ms(self) -> float:
        """How late the output is against the input (half the filter's length)."""
        return self._delay_ms

    def process(self, pcm: bytes) -> bytes:
        """Resample the next chunk of the stream; returns the output it completes."""
        if len(pcm) & 1:
            raise PcmLengthError(len(pcm))
        if not pcm:
            return b""
        keep = self._keep
        buffer = self._buffer
        if not self._pending and len(pcm) == 2 * self._steady_in:
            buffer[keep:] = np.frombuffer(pcm, dtype="<i2")
            out = self._product(buffer, self._steady_in // self._down, self._steady_view)
            buffer[:keep] = buffer[len(buffer) - keep :]
            return out
        data = self._pending + pcm
        usable = len(data) // 2 // self._down * self._down
        self._pending = data[2 * usable :]
        if not usable:
            return b""
        x = np.concatenate((buffer[:keep], np.frombuffer(data[: 2 * usable], dtype="<i2")))
        out = self._product(x, usable // self._down)
        buffer[:keep] = x[len(x) - keep :]
        return out

    def _product(
        self,
        x: npt.NDArray[np.float32],
        periods: int,
        windows: npt.NDArray[np.float32] | None = None,
    ) -> bytes:
        """The output of ``periods`` ratio periods of ``x`` (whose first ``width`` inputs
        are the first period's window) as s16le; ``windows``: x's window view, if made."""
        if self.compiled and KERNELS is not None:
            product: bytes = KERNELS.polyphase_pcm16(
                x, self._coefficients, self._width, self._up, self._down, periods
            )
            return product
        if windows is None:
            windows = np.lib.stride_tricks.as_strided(
                x, (periods, self._width), (self._down * x.itemsize, x.itemsize), writeable=False
            )
        return _to_pcm16(np.dot(windows, self._coefficients))

    def flush(self) -> bytes:
        """End the stream: return the output the filter still owes, then reset.

        That is the filter's delay (:attr:`delay_ms`) worth of output, pushed out
        with silence, so the whole stream's output is exactly its input's
        duration at the output rate, shifted by the delay.
        """
        owed_in = math.ceil(self._delay_ms * self._in_rate / 1000)
        owed_in = -(-owed_in // self._down) * self._down
        owed_out = len(self._pending) // 2 * self._up // self._down
        owed_out += round(self._delay_ms * self._out_rate / 1000)
        pad = (-(len(self._pending) // 2)) % self._down
        tail = self.process(bytes(2 * (pad + owed_in)))
        self.reset()
        return tail[: 2 * owed_out]

    def reset(self) -> None:
        """Forget all stream state and pending input (for a new, unrelated stream)."""
        self._buffer.fill(0.0)
        self._pending = b""


def _to_pcm16(y: npt.NDArray[np.float32]) -> bytes:
    """Round and saturate the filter's output (one row per period) to s16le bytes."""
    np.rint(y, out=y)
    np.minimum(y, _PCM16_MAX, out=y)
    np.maximum(y, _PCM16_MIN, out=y)
    return y.astype("<i2").tobytes()
