"""Line echo canceller: the echo the caller's line carries back, predicted sample by sample.

The echo gate (:mod:`media.echo_gate`) judges frames by energy; once it knows
the echo's delay, a caller quieter than a loud echo (6-10 dB of return loss)
is below what energy can separate. :class:`LineEchoCanceller` subtracts the
echo instead: a linear filter of ``taps`` samples (8 kHz, the phone band)
around the echo's delay, fitted by least squares to what the line carries
back, so what is left (the *residual*) is the caller plus a little echo.

- **Timelines.** Render (what the core sent) is laid on a sample timeline by
  send time, frames sent in a burst back to back (the provider plays them so);
  capture (what came back) on its own contiguous timeline. The delay between
  the two, in samples, is found by normalised cross-correlation over the last
  ``align_window_ms`` of capture, around the frame delay the echo gate found.
- **Fit.** Least squares over the recent past, with forgetting: the render's
  autocorrelation (the normal equations' Toeplitz approximation) and its
  cross-correlation with the capture, both decayed by ``forget`` per frame,
  solved every ``solve_every`` frames. A caller talking over the echo is, to
  the fit, noise that does not correlate with the render: it widens the
  estimate's spread and does not bias it, so nothing here needs to know who
  is talking (a plain NLMS needs a double-talk detector to stop it diverging).
- **Quality.** :attr:`erle_db` is the echo return loss enhancement the filter
  achieves on recent frames with render (a high percentile of capture minus
  residual level, i.e. of the frames where the echo was alone); until it is
  at least ``min_erle_db`` the residual is not to be trusted.

Measured: a one-off least-squares fit of 64 taps over one second of the
reflex rig's 10 dB echo line cancelled 34 dB; ``tests/test_media_line_echo.py``
holds this filter to at least 25 dB on a short dispersive path and 20 dB after
a fit made over double talk. The echo gate and this filter together cost
65-100 µs per frame pair (``bench/echo_gate.py``, an AMD EPYC VM). Each frame's
filter step runs in C where the media kernels are built (``media/_kernels.c``
``lec_frame``: the same sums in index order, the same on every CPU), numpy's
here otherwise (its dot products sum in the order of the BLAS kernel numpy picks
for the CPU: the two agree to ~1e-11 relative, as numpy on one CPU does with
numpy on another); the solve is numpy's either way. Sans-I/O: time comes in
as milliseconds; nothing here reads a clock. Frames are the echo gate's
narrowband samples (160 at 8 kHz, :mod:`media.narrowband`), as float arrays.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from rutster.media import echo_kernels
from rutster.media.compiled import KERNELS
from rutster.media.formats import NARROWBAND_FRAME_SAMPLES, NARROWBAND_SAMPLE_RATE

__all__ = [
    "ALIGN_MIN_CORRELATION",
    "ALIGN_WINDOW_MS",
    "FORGET",
    "MIN_ERLE_DB",
    "PRE_EMPHASIS",
    "SOLVE_EVERY",
    "TAPS",
    "WAVE_FRAME",
    "LineEchoCanceller",
    "LineEchoConfig",
    "fft_size",
    "normalised_xcorr",
    "normalised_xcorr_peak",
]

#: Samples per frame at the filter's rate (a narrowband frame, media.narrowband).
WAVE_FRAME = NARROWBAND_FRAME_SAMPLES
#: Filter's sample rate.
WAVE_RATE = NARROWBAND_SAMPLE_RATE
#: Filter length (8 kHz samples): 8 ms, the dispersion of a 2-to-4-wire hybrid's
#: echo path (ITU-T G.168 designs for 64 ms tails, but the energy of a line
#: echo is in its first few ms; measured, 64 taps cancelled 34 dB on the rig).
TAPS = 64
#: Taps kept before the correlation peak (the filter's causal slack), 2 ms.
PRE_TAPS = 16
#: Forgetting factor of the correlations per 20 ms frame: a memory of about a
#: second (seed decision: the echo path is stable over seconds).
FORGET = 0.98
#: Solve the normal equations every this many frames with render (seed decision:
#: 100 ms; a 64-tap solve costs ~20 µs).
SOLVE_EVERY = 5
#: Capture used to align the render to the sample (seed decision: 0.5 s, a few
#: syllables).
ALIGN_WINDOW_MS = 500.0
#: Normalised cross-correlation an alignment needs to be believed (seed
#: decision, checked on the tune split's recorded calls: echo alone correlates
#: 0.9 and more; independent speech, over the lag range, under 0.35).
ALIGN_MIN_CORRELATION = 0.5
#: Pre-emphasis before correlating (the usual 0.9 of speech analysis): the
#: low-frequency bulk any two voices share must not correlate them.
PRE_EMPHASIS = 0.9
#: ERLE below which the residual is not trusted (seed decision).
MIN_ERLE_DB = 12.0
#: Percentile of recent (capture - residual) levels taken as the ERLE: the
#: frames where the echo was alone show the filter's ERLE, double talk less.
ERLE_PERCENTILE = 80.0
#: Recent frames with render that ERLE is measured over (2 s).
ERLE_FRAMES = 100
#: Frames with render the ERLE needs before it is measured at all: half a second
#: (seed decision; on the tune split 10 frames heard the first answer's caller on
#: the 6 dB line no sooner, P95 260 -> 280 ms, and paused 1.5 more times a minute
#: on noise over that echo).
ERLE_MIN_FRAMES = ERLE_FRAMES // 4
#: Render energy, relative to the capture's, under which an offset is not
#: correlated at all (-60 dB: far below any echo worth finding).
_MIN_RENDER_SHARE = 1e-6
#: Regularisation of the normal equations, relative to the render's power.
_RIDGE = 1e-3
#: Render power (mean square, PCM16 units) under which a frame teaches nothing.
_MIN_RENDER_POWER = 32768.0**2 * 10 ** (-60 / 10)
_FULL_SCALE_DB = 20 * math.log10(32768.0)


def _percentile(values: npt.NDArray[np.float64], q: float) -> float:
    """``np.percentile(values, q)`` (linear interpolation) by partition: ~2 µs, not ~60."""
    position = q / 100.0 * (len(values) - 1)
    lo = math.floor(position)
    hi = min(lo + 1, len(values) - 1)
    part = np.partition(values, (lo, hi))
    return float(part[lo] + (part[hi] - part[lo]) * (position - lo))


def _level_db(power: float) -> float:
    return 10 * math.log10(max(power, 1e-3)) - _FULL_SCALE_DB


@functools.cache
def fft_size(n: int) -> int:
    """The least 5-smooth number (2^a 3^b 5^c) at or above ``n``, for numpy's FFT.

    Written here because numpy has no ``next_fast_len`` (SciPy's, not a
    dependency). pocketfft is fastest on such sizes: measured on the echo
    gate's coherence test (5,280 render samples), 97-105 µs for one
    correlation at 5,400 or 5,760 against 168 µs at 5,280 (a factor of 11) and
    203 µs at the next power of two, 8,192.
    """
    best = 1 << max(0, n - 1).bit_length()  # a power of two is 5-smooth
    five = 1
    while five < best:
        three = five
        while three < best:
            size = three
            while size < n:
                size *= 2
            best = min(best, size)
            three *= 3
        five *= 5
    return best


@functools.cache
def _toeplitz_index(taps: int) -> npt.NDArray[np.int64]:
    """Index of the normal equations' Toeplitz matrix, |i - j|: shared by every call
    (read only; 32 KB each at 64 taps)."""
    lags = np.arange(taps)
    index: npt.NDArray[np.int64] = np.abs(lags[:, None] - lags[None, :])
    index.setflags(write=False)
    return index


def _correlation(
    render: npt.NDArray[np.float64], capture: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], float] | None:
    """The raw correlation of the pre-emphasised capture with the pre-emphasised render
    at every offset, that render, and the capture's energy; None for a silent capture.
    ``render`` is at least as long as ``capture``."""
    # Circular correlation over ``len(render)`` samples or more: a valid offset k reads
    # r[k .. k + len(c) - 1], never past len(r) - 1, so nothing wraps onto it. Both
    # signals, zero-padded to that size, are the two rows of one array: numpy's FFT
    # runs a batch's rows side by side in vector lanes, so their two transforms cost
    # about 1.3 of one where apart they cost 2, with the same results bit for bit
    # (tests/test_media_line_echo.py).
    size = fft_size(len(render))
    rows = np.zeros((2, size))
    r, c = rows[0, : len(render)], rows[1, : len(capture)]
    echo_kernels.pre_emphasis(np.ascontiguousarray(capture, dtype=np.float64), c, PRE_EMPHASIS)
    c_energy = float(c @ c)
    if c_energy <= 0.0:
        return None
    echo_kernels.pre_emphasis(np.ascontiguousarray(render, dtype=np.float64), r, PRE_EMPHASIS)
    spectra = np.fft.rfft(rows, axis=1)
    corr = np.fft.irfft(spectra[0] * np.conj(spectra[1]), size)
    return corr, r, c_energy


def normalised_xcorr(
    render: npt.NDArray[np.float64], capture: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Normalised cross-correlation of ``capture`` with ``render`` at every offset.

    Both pre-emphasised (:data:`PRE_EMPHASIS`); entry k compares ``capture``
    with ``render[k : k + len(capture)]``. Offsets where the render carries
    (almost) nothing give 0: the FFT's rounding, over a vanishing energy,
    must not pass for a match. One FFT correlation, so the whole lag range
    costs what one offset would, many times over. (The echo gate and the
    canceller want only the peak: :func:`normalised_xcorr_peak`.)
    """
    valid = len(render) - len(capture) + 1
    prepared = None if valid <= 0 else _correlation(render, capture)
    if prepared is None:
        return np.zeros(max(valid, 0))
    corr, r, c_energy = prepared
    return echo_kernels.ncc_numpy(corr, r, len(capture), c_energy, _MIN_RENDER_SHARE)


def normalised_xcorr_peak(
    render: npt.NDArray[np.float64], capture: npt.NDArray[np.float64]
) -> tuple[float, int] | None:
    """The best of :func:`normalised_xcorr` and its offset (the first of equals); None
    when ``capture`` is longer than ``render`` (no offset). The search and the
    normalisation run in the compiled kernel where it is built (media/echo_kernels.py)."""
    valid = len(render) - len(capture) + 1
    if valid <= 0:
        return None
    prepared = _correlation(render, capture)
    if prepared is None:
        return 0.0, 0  # a silent capture correlates with nothing
    corr, r, c_energy = prepared
    return echo_kernels.ncc_peak(corr, r, len(capture), c_energy, _MIN_RENDER_SHARE)


@dataclass(frozen=True, slots=True)
class LineEchoConfig:
    """Tuning of a :class:`LineEchoCanceller` (each default a named constant with its source)."""

    taps: int = TAPS
    pre_taps: int = PRE_TAPS
    forget: float = FORGET
    solve_every: int = SOLVE_EVERY
    align_window_ms: float = ALIGN_WINDOW_MS
    min_erle_db: float = MIN_ERLE_DB


class LineEchoCanceller:
    """One call's linear echo canceller at 8 kHz (see the module docstring)."""

    def __init__(self, config: LineEchoConfig | None = None) -> None:
        self.config = config = config if config is not None else LineEchoConfig()
        self._taps = config.taps
        self._ring = WAVE_RATE * 4  # render kept: 4 s, beyond any echo delay searched
        self._render = np.zeros(self._ring)
        self._render_end: int | None = None  # timeline position after the newest render
        self._align = int(config.align_window_ms * WAVE_RATE / 1000)
        # Capture kept: what one alignment reads, and the frame being taken (nothing
        # older is ever read; 33 KB where 4 s took 256 KB a call).
        self._capture = np.zeros(self._align + WAVE_FRAME)
        self._capture_end: int | None = None
        self.delay: int | None = None  # samples, capture position - render position
        #: The last alignment's best correlation and its delay (samples), found or not:
        #: a weak peak that comes back at one lag is echo under the line's noise
        #: (media.echo_gate ECHO_HINT_CORRELATION).
        self.best_correlation = 0.0
        self.best_delay: int | None = None
        self._r = np.zeros(config.taps)  # render autocorrelation, lags 0..taps-1
        self._p = np.zeros(config.taps)  # cross-correlation with the capture
        self._w = np.zeros(config.taps)
        self._toeplitz = _toeplitz_index(config.taps)
        self._until_solve = config.solve_every
        # Recent (capture - residual) levels, a ring (order does not matter to a percentile).
        self._erle = np.zeros(ERLE_FRAMES)
        self._erle_count = 0
        self._erle_next = 0
        self.erle_db = 0.0

    # ---- timelines -----------------------------------------------------------

    def render(self, band: npt.NDArray[np.float64], sent_ms: float) -> None:
        """Lay a frame the core sent at ``sent_ms`` (its narrowband samples) on the timeline."""
        start = round(sent_ms * WAVE_RATE / 1000)
        end = self._render_end
        if end is not None:
            if start < end:
                start = end  # sent in a burst: it plays after the previous one
            elif start > end:
                self._zero(self._render, end, start)
        self._put(self._render, start, band)
        self._render_end = start + WAVE_FRAME

    def unplayed(self, frames: int) -> None:
        """The newest ``frames`` frames rendered were never played (a provider ``clear``)."""
        end = self._render_end
        if end is None or frames <= 0:
            return
        start = end - frames * WAVE_FRAME
        self._zero(self._render, start, end)
        self._render_end = start

    @staticmethod
    def _put(ring: npt.NDArray[np.float64], at: int, x: npt.NDArray[np.float64]) -> None:
        size = len(ring)
        i = at % size
        n = len(x)
        if i + n <= size:
            ring[i : i + n] = x
        else:
            k = size - i
            ring[i:] = x[:k]
            ring[: n - k] = x[k:]

    def _zero(self, ring: npt.NDArray[np.float64], a: int, b: int) -> None:
        if b - a >= len(ring):
            ring.fill(0.0)
        elif b > a:
            self._put(ring, a, np.zeros(b - a))

    @staticmethod
    def _get(ring: npt.NDArray[np.float64], a: int, n: int) -> npt.NDArray[np.float64]:
        size = len(ring)
        i = a % size
        if i + n <= size:
            return ring[i : i + n].copy()
        return np.concatenate((ring[i:], ring[: n - (size - i)]))

    def _render_at(self, a: int, n: int) -> npt.NDArray[np.float64]:
        """Render samples ``a .. a+n``; silence beyond what was laid down."""
        out = self._get(self._render, a, n)
        end = self._render_end
        if end is None:
            out.fill(0.0)
            return out
        if a + n > end:
            out[max(0, end - a) :] = 0.0
        oldest = end - self._ring
        if a < oldest:
            out[: min(n, oldest - a)] = 0.0
        return out

    # ---- alignment -----------------------------------------------------------

    def align(self, delay_ms: float, spread_ms: float) -> bool:
        """Find the echo's delay to the sample within ``delay_ms`` ± ``spread_ms``.

        Returns whether a delay was found (the capture correlates with the
        render there); a new delay restarts the fit. The best correlation and
        its delay are kept either way (``best_correlation``, ``best_delay``).
        """
        end = self._capture_end
        if end is None:
            return False
        n = self._align
        capture = self._get(self._capture, end - n, n)
        lo = round((delay_ms - spread_ms) * WAVE_RATE / 1000)
        hi = round((delay_ms + spread_ms) * WAVE_RATE / 1000)
        render = self._render_at(end - n - hi, n + hi - lo)
        peak = normalised_xcorr_peak(render, capture)
        if peak is None:
            return False
        correlation, best = peak
        delay = hi - best
        self.best_correlation = correlation
        self.best_delay = delay
        if correlation < ALIGN_MIN_CORRELATION:
            return False
        if self.delay is None or abs(delay - self.delay) > 2:
            self.delay = delay
            self._restart()
        return True

    def forget(self) -> None:
        """Drop the delay and the fit (the echo path is unknown again)."""
        self.delay = None
        self._restart()

    def restart_capture(self) -> None:
        """Caller audio went missing: lay the next capture frame by its own arrival time.

        The capture timeline is otherwise contiguous (late frames are placed one after
        another), while render is laid by send time: after audio lost, a timeline run on
        from before the gap would put every echo that much off where it is looked for.
        The delay and the fit go too (:meth:`forget`).
        """
        self._capture.fill(0.0)
        self._capture_end = None
        self.forget()

    def _restart(self) -> None:
        self._r.fill(0.0)
        self._p.fill(0.0)
        self._w.fill(0.0)
        self._erle_count = 0
        self._erle_next = 0
        self.erle_db = 0.0
        self._until_solve = self.config.solve_every

    # ---- the filter ----------------------------------------------------------

    def capture(
        self, x: npt.NDArray[np.float64], now_ms: float
    ) -> tuple[float, float, npt.NDArray[np.float64]] | None:
        """Take a caller frame (its narrowband samples).

        Returns the residual's level and the echo estimate's level (dBFS) and
        the residual itself; None while no delay is known or no render
        reaches the filter.
        """
        end = self._capture_end
        start = round(now_ms * WAVE_RATE / 1000) - WAVE_FRAME if end is None else end
        self._put(self._capture, start, x)
        self._capture_end = start + WAVE_FRAME
        delay = self.delay
        if delay is None:
            return None
        taps = self._taps
        # Render for sample n of this frame, tap k: r[start + n - delay + pre - k].
        base = start - delay + self.config.pre_taps
        seg = self._render_at(base - taps + 1, WAVE_FRAME + taps - 1)
        if float(seg @ seg) / len(seg) < _MIN_RENDER_POWER:
            return None
        # Sample n, tap k reads seg[n + taps - 1 - k]: the echo estimate is the
        # filter convolved with the render, and the cross-correlation's tap k
        # sums x[n] seg[n + taps - 1 - k], a correlation read backwards. numpy's
        # direct convolve/correlate loops cost ~5 µs a frame together, against ~16
        # for the same sums as matrix products over a strided Toeplitz view
        # (measured; they agree to 1e-15 relative).
        forget = self.config.forget
        if KERNELS is not None:
            # The same step in C, the sums in index order (media/_kernels.c lec_frame):
            # 3.6 µs a frame against numpy's ~19 (measured alone, this VM, 2026-12-07).
            residual = np.empty(len(x))
            x_energy, residual_energy, echo_energy = KERNELS.lec_frame(
                seg,
                self._w,
                np.ascontiguousarray(x, dtype=np.float64),
                self._r,
                self._p,
                forget,
                residual,
            )
        else:
            echo = np.convolve(seg, self._w, "valid")
            residual = x - echo
            self._r *= forget
            self._r += np.correlate(seg, seg[taps - 1 :], "valid")[::-1]
            self._p *= forget
            self._p += np.correlate(seg, x, "valid")[::-1]
            x_energy = float(x @ x)
            residual_energy = float(residual @ residual)
            echo_energy = float(echo @ echo)
        self._until_solve -= 1
        if self._until_solve <= 0:
            self._until_solve = self.config.solve_every
            self._solve()
            if self._erle_count >= ERLE_MIN_FRAMES:
                self.erle_db = _percentile(self._erle[: self._erle_count], ERLE_PERCENTILE)
        capture_db = _level_db(x_energy / WAVE_FRAME)
        residual_db = _level_db(residual_energy / WAVE_FRAME)
        echo_db = _level_db(echo_energy / WAVE_FRAME)
        self._erle[self._erle_next] = capture_db - residual_db
        self._erle_next = (self._erle_next + 1) % ERLE_FRAMES
        self._erle_count = min(self._erle_count + 1, ERLE_FRAMES)
        return residual_db, echo_db, residual

    @property
    def trusted(self) -> bool:
        """Whether the fit cancels enough echo for its residual to be judged."""
        return self.delay is not None and self.erle_db >= self.config.min_erle_db

    def _solve(self) -> None:
        r = self._r
        if r[0] <= 0.0:
            return
        toeplitz = r[self._toeplitz]
        toeplitz[np.diag_indices(self._taps)] += _RIDGE * r[0]
        try:
            self._w = np.asarray(np.linalg.solve(toeplitz, self._p), dtype=np.float64)
        except np.linalg.LinAlgError:
            return
