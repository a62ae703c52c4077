"""The line echo canceller (media/line_echo.py): alignment, the fit, double talk, clears."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from rutster.media import echo_kernels
from rutster.media.line_echo import (
    _MIN_RENDER_SHARE,
    PRE_EMPHASIS,
    WAVE_FRAME,
    WAVE_RATE,
    LineEchoCanceller,
    fft_size,
    normalised_xcorr,
    normalised_xcorr_peak,
)

FIXTURE = Path(__file__).parent / "fixtures/audio/caller_speech_8k.wav"
#: Echo path of the tests (8 kHz taps): short and dispersive, as a hybrid's.
ECHO_PATH = np.array([0.0, 0.5, 0.25, -0.12, 0.05])
DELAY_SAMPLES = 1_700  # 212.5 ms, not a whole frame


def _speech(start_s: float, seconds: float) -> npt.NDArray[np.float64]:
    import wave

    with wave.open(str(FIXTURE), "rb") as w:
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64)
    return x[int(start_s * WAVE_RATE) : int((start_s + seconds) * WAVE_RATE)]


def _frames(x8: npt.NDArray[np.float64]) -> list[npt.NDArray[np.float64]]:
    """8 kHz samples as narrowband frames (PCM16 values, as the echo gate passes them)."""
    x = np.clip(np.rint(x8), -32768, 32767)
    n = len(x) // WAVE_FRAME
    return [x[i * WAVE_FRAME : (i + 1) * WAVE_FRAME] for i in range(n)]


def _echo(render8: npt.NDArray[np.float64], gain: float) -> npt.NDArray[np.float64]:
    out = np.zeros(len(render8) + DELAY_SAMPLES)
    out[DELAY_SAMPLES:] = np.convolve(render8, ECHO_PATH)[: len(render8)] * gain
    return out[: len(render8)]


def _run(
    lec: LineEchoCanceller, render8: npt.NDArray[np.float64], capture8: npt.NDArray[np.float64]
) -> list[tuple[float, float] | None]:
    """Render frame k sent at 20k ms, capture frame k heard at 20(k+1) ms; align every 10 frames."""
    out: list[tuple[float, float] | None] = []
    for k, (r, c) in enumerate(zip(_frames(render8), _frames(capture8), strict=True)):
        lec.render(r, 20.0 * k)
        result = lec.capture(c, 20.0 * (k + 1))
        out.append(None if result is None else (result[0], result[1]))
        if k % 10 == 9 and not lec.trusted:
            lec.align(330.0, 290.0)  # the whole 40-620 ms lag range
    return out


def test_aligns_to_the_sample_and_cancels_a_dispersive_echo() -> None:
    render = _speech(2.5, 6.0)
    lec = LineEchoCanceller()
    _run(lec, render, _echo(render, 0.5))
    # Frame k is sent at 20k ms and heard (ending) at 20(k + 1) ms: the timelines
    # line up, and the delay found is the path's, to its strongest tap.
    peak = DELAY_SAMPLES + int(np.argmax(np.abs(ECHO_PATH)))
    assert lec.delay is not None and abs(lec.delay - peak) <= 2
    assert lec.trusted
    assert lec.erle_db >= 25.0


def test_independent_speech_is_not_taken_for_echo() -> None:
    lec = LineEchoCanceller()
    _run(lec, _speech(2.5, 6.0), _speech(11.7, 6.0) * 0.5)
    assert lec.delay is None and not lec.trusted


def test_double_talk_does_not_spoil_the_fit() -> None:
    """A caller as loud as the echo, talking all along: the fit still cancels the echo."""
    render = _speech(2.5, 8.0)
    echo = _echo(render, 0.5)
    caller = np.zeros_like(echo)
    caller[: 6 * WAVE_RATE] = _speech(14.0, 6.0) * 0.5
    lec = LineEchoCanceller()
    results = _run(lec, render, echo + caller)
    assert lec.trusted
    # The last two seconds: echo alone, cancelled by the fit made over double talk.
    tail = [r for r in results[-100:] if r is not None]
    assert tail and np.median([echo_db - residual_db for residual_db, echo_db in tail]) >= 20.0


def test_unplayed_render_is_silence() -> None:
    lec = LineEchoCanceller()
    frame = _frames(_speech(3.0, 0.1))[0]
    for k in range(3):
        lec.render(frame, 20.0 * k)
    lec.unplayed(2)
    assert not lec._render_at(WAVE_FRAME, 2 * WAVE_FRAME).any()
    assert lec._render_at(0, WAVE_FRAME).any()


@pytest.mark.parametrize("frames", [0, -1])
def test_unplayed_of_nothing_changes_nothing(frames: int) -> None:
    lec = LineEchoCanceller()
    lec.unplayed(frames)
    lec.render(np.zeros(WAVE_FRAME), 0.0)
    lec.unplayed(frames)
    assert lec._render_end == WAVE_FRAME


def _five_smooth(n: int) -> bool:
    for p in (2, 3, 5):
        while n % p == 0:
            n //= p
    return n == 1


def test_fft_size_is_the_least_five_smooth_length_at_or_above() -> None:
    for n in range(1, 12_000):
        size = fft_size(n)
        assert size >= n and _five_smooth(size), n
        assert not any(_five_smooth(m) for m in range(n, size)), n


@pytest.mark.parametrize("render_len", [640, 5_280, 5_281, 7_777])
def test_normalised_xcorr_matches_the_direct_sum(render_len: int) -> None:
    rng = np.random.default_rng(render_len)
    render = rng.normal(0, 3000, render_len)
    capture = render[100 : 100 + 2 * WAVE_FRAME] * 0.3 + rng.normal(0, 100, 2 * WAVE_FRAME)
    ncc = normalised_xcorr(render, capture)
    r = render - PRE_EMPHASIS * np.concatenate(([0.0], render[:-1]))
    c = capture - PRE_EMPHASIS * np.concatenate(([0.0], capture[:-1]))
    direct = np.array(
        [
            r[k : k + len(c)] @ c / np.sqrt((r[k : k + len(c)] @ r[k : k + len(c)]) * (c @ c))
            for k in range(len(r) - len(c) + 1)
        ]
    )
    np.testing.assert_allclose(ncc, direct, atol=1e-9)
    assert int(ncc.argmax()) == 100


@pytest.mark.parametrize(
    ("render_len", "capture_len"), [(5_280, 320), (5_281, 320), (8_800, 4_000), (321, 320), (97, 1)]
)
def test_the_paired_transforms_give_the_separate_transforms_bit_for_bit(
    render_len: int, capture_len: int
) -> None:
    # The correlation transforms the render and the capture as two rows of one array
    # (numpy runs a batch's rows side by side): every figure must be what two separate
    # transforms give, to the last bit, or the echo gate's verdicts could move.
    rng = np.random.default_rng(render_len + capture_len)
    render = rng.normal(0, 3000, render_len)
    capture = rng.normal(0, 1000, capture_len)
    r = np.empty(render_len)
    c = np.empty(capture_len)
    echo_kernels.pre_emphasis(render, r, PRE_EMPHASIS)
    echo_kernels.pre_emphasis(capture, c, PRE_EMPHASIS)
    size = fft_size(render_len)
    corr = np.fft.irfft(np.fft.rfft(r, size) * np.conj(np.fft.rfft(c, size)), size)
    expected = echo_kernels.ncc_numpy(corr, r, capture_len, float(c @ c), _MIN_RENDER_SHARE)
    assert np.array_equal(normalised_xcorr(render, capture), expected)
    best = int(expected.argmax())
    assert normalised_xcorr_peak(render, capture) == (float(expected[best]), best)


def test_a_failed_alignment_keeps_its_best_peak() -> None:
    """Echo far under noise: no delay is found, but the best peak sits at the echo's lag.

    (media.echo_gate ECHO_HINT_CORRELATION reads ``best_correlation`` and
    ``best_delay`` of the failed searches.) Independent speech peaks lower, anywhere.
    """
    render = _speech(2.5, 3.0)
    rng = np.random.default_rng(3)
    echo = _echo(render, 0.5)
    noise = rng.normal(0.0, 2.0 * float(np.sqrt(np.mean(echo**2))), len(echo))
    lec = LineEchoCanceller()
    _run(lec, render, echo + noise)
    assert lec.delay is None
    assert 0.1 <= lec.best_correlation < 0.5
    assert lec.best_delay is not None
    peak = DELAY_SAMPLES + int(np.argmax(np.abs(ECHO_PATH)))
    assert abs(lec.best_delay - peak) <= 2
    other = LineEchoCanceller()
    _run(other, render, _speech(11.7, 3.0) * 0.5)
    assert other.delay is None and other.best_correlation < 0.1
